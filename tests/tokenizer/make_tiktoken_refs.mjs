// Reference ids for Kiln's tiktoken tests, from the npm package js-tiktoken (installed in
// tests/npm). Run from the repository root:
//   node tests/tokenizer/make_tiktoken_refs.mjs tests/data/tokenizer/corpus.json tests/data/tokenizer/tiktoken_refs.json
// Special tokens written in the text are allowed (encode(text, "all")), as Kimi's tokenizer does.
import { createRequire } from "module";
import fs from "fs";
import path from "path";

const require = createRequire(path.resolve("tests/npm/package.json"));
const { Tiktoken } = require("js-tiktoken/lite");
const pkg = JSON.parse(fs.readFileSync(path.resolve("tests/npm/node_modules/js-tiktoken/package.json"), "utf8"));
const [corpusPath, outPath] = process.argv.slice(2);
const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
const out = { js_tiktoken_version: pkg.version, encodings: {} };
for (const name of ["cl100k_base", "o200k_base"]) {
  const ranks = require(`js-tiktoken/ranks/${name}`);
  const enc = new Tiktoken(ranks);
  const cases = corpus.map((e) => {
    const text = e.text !== undefined ? e.text : new TextDecoder().decode(Buffer.from(e.hex, "hex"));
    return enc.encode(text, "all");
  });
  out.encodings[name] = { pat_str: ranks.pat_str, special_tokens: ranks.special_tokens, cases };
}
fs.writeFileSync(outPath, JSON.stringify(out));
console.log(`wrote ${outPath}`);
