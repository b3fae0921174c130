// End-to-end checks of `kiln serve` with the official openai npm client and raw fetch.
// Usage: node e2e.mjs --base-url http://127.0.0.1:PORT --suite e2e|auth|bad|load|disconnect|tools
//        [--api-key KEY] [--model NAME] [--count N] [--mode stream|json]
// Prints one line per check; exits 1 on the first failure (with what was received).
import { pathToFileURL } from "node:url";
import path from "node:path";
import assert from "node:assert/strict";
import fs from "node:fs";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []));
const base = args["base-url"];
const suite = args["suite"] ?? "e2e";
const here = path.dirname(new URL(import.meta.url).pathname);
const { default: OpenAI } = await import(pathToFileURL(path.join(here, "..", "npm", "node_modules", "openai", "index.mjs")));

// The whole run is bounded: a hang is a failure, not a stuck CI job.
setTimeout(() => { console.error(`TIMEOUT in suite ${suite}`); process.exit(2); }, Number(args["deadline-s"] ?? 150) * 1000).unref();

const client = (key) => new OpenAI({ baseURL: `${base}/v1`, apiKey: key ?? "unused", maxRetries: 0, timeout: 60000 });
const ok = (name) => console.log(`ok   ${name}`);

async function modelName(key) {
  const list = await client(key ?? args["api-key"]).models.list();
  return list.data[0].id;
}

async function e2e() {
  const c = client();
  const models = await c.models.list();
  assert.equal(models.data.length, 1);
  const model = models.data[0].id;
  ok(`list models: ${model}`);

  const messages = [{ role: "user", content: "Tell me a story about a cat." }];
  const full = await c.chat.completions.create({ model, messages, temperature: 0, max_tokens: 16 });
  const text = full.choices[0].message.content;
  assert.equal(full.object, "chat.completion");
  assert.equal(full.choices[0].message.role, "assistant");
  assert.ok(["stop", "length"].includes(full.choices[0].finish_reason));
  assert.ok(full.usage.prompt_tokens > 0 && full.usage.completion_tokens > 0);
  assert.equal(full.usage.total_tokens, full.usage.prompt_tokens + full.usage.completion_tokens);
  assert.ok(typeof full.usage.prompt_tokens_details.cached_tokens === "number");
  ok(`chat non-streaming: ${JSON.stringify(text)}`);

  const stream = await c.chat.completions.create({ model, messages, temperature: 0, max_tokens: 16, stream: true,
    stream_options: { include_usage: true } });
  let pieces = "", usage = null, finish = null, roleSeen = false;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) {
      if (ch.delta.role) roleSeen = true;
      pieces += ch.delta.content ?? "";
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.equal(pieces, text, "streamed pieces concatenate to the non-streamed text");
  assert.ok(roleSeen && finish);
  assert.ok(usage && usage.completion_tokens === full.usage.completion_tokens, `usage chunk: ${JSON.stringify(usage)}`);
  ok("chat streaming equals non-streaming, usage chunk present");

  // max_completion_tokens is honoured the same as max_tokens.
  const mct = await c.chat.completions.create({ model, messages, temperature: 0, max_completion_tokens: 3 });
  assert.ok(mct.usage.completion_tokens <= 3);
  ok("max_completion_tokens");

  const comp = await c.completions.create({ model, prompt: "Once upon a time", max_tokens: 5, temperature: 0,
    logprobs: 3, echo: true });
  const lp = comp.choices[0].logprobs;
  const ctext = comp.choices[0].text;
  assert.ok(ctext.startsWith("Once upon a time"));
  // echo: the prompt's tokens come first (the first with a null logprob), then the completion's.
  assert.equal(lp.tokens.length, comp.usage.prompt_tokens + comp.usage.completion_tokens);
  assert.equal(lp.token_logprobs.length, lp.tokens.length);
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  assert.ok(lp.token_logprobs.slice(1).every((x) => typeof x === "number" && x <= 0));
  assert.ok(lp.top_logprobs.slice(1).every((t) => Object.keys(t).length >= 1));
  assert.equal(lp.text_offset[0], 0);
  assert.equal(lp.tokens.slice(0, comp.usage.prompt_tokens).join(""), "Once upon a time");
  for (let i = 0; i < lp.tokens.length; i++)
    assert.equal(ctext.slice(lp.text_offset[i], lp.text_offset[i] + lp.tokens[i].length), lp.tokens[i]);
  ok("completions with echo and logprobs (prompt tokens scored)");
  // text_offset counts UTF-8 bytes, each token's once: a character split over byte-level tokens
  // ("é" here, U+FFFD in each token's text) is not counted as one U+FFFD per piece.
  const uni = await c.completions.create({ model, prompt: "h\u00e9llo \u{1F600} w\u00f6rld", max_tokens: 4,
    temperature: 0, logprobs: 1, echo: true });
  const ulp = uni.choices[0].logprobs, ubytes = Buffer.from(uni.choices[0].text, "utf8");
  const uoff = [...ulp.text_offset, ubytes.length];
  for (let i = 0; i < ulp.tokens.length; i++) {
    assert.ok(uoff[i] < uoff[i + 1], `text_offset ${uoff[i]} then ${uoff[i + 1]}`);
    if (!ulp.tokens[i].includes("\uFFFD"))
      assert.equal(ubytes.subarray(uoff[i], uoff[i + 1]).toString("utf8"), ulp.tokens[i], `token ${i}`);
  }
  assert.ok(ulp.tokens.some((t) => t.includes("\uFFFD")), "no token split a character: the check above proves less");
  ok("completions logprobs: text_offset in bytes over split characters");
  // max_tokens 0 with echo scores the prompt: the same prompt logprobs, nothing generated.
  const scored = await c.completions.create({ model, prompt: "Once upon a time", max_tokens: 0, logprobs: 1,
    echo: true });
  const slp = scored.choices[0].logprobs;
  assert.equal(scored.choices[0].text, "Once upon a time");
  assert.equal(scored.usage.completion_tokens, 0);
  assert.equal(slp.tokens.length, comp.usage.prompt_tokens);
  for (let i = 1; i < slp.tokens.length; i++)
    assert.ok(Math.abs(slp.token_logprobs[i] - lp.token_logprobs[i]) < 1e-4, `prompt logprob ${i}`);
  // Streaming: the echo event carries the prompt's logprobs.
  const sstream = await c.completions.create({ model, prompt: "Once upon a time", max_tokens: 3, temperature: 0,
    logprobs: 1, echo: true, stream: true });
  const stoks = [];
  let stext = "";
  for await (const chunk of sstream)
    for (const ch of chunk.choices) {
      stext += ch.text ?? "";
      if (ch.logprobs) stoks.push(...ch.logprobs.tokens);
    }
  assert.ok(stext.startsWith("Once upon a time"));
  assert.equal(stoks.length, comp.usage.prompt_tokens + 3);
  ok("completions max_tokens 0 (prompt scoring) and streamed echo with logprobs");

  const ids = await c.completions.create({ model, prompt: [10, 20, 30, 40], max_tokens: 4, temperature: 0 });
  assert.equal(ids.usage.prompt_tokens, 4);
  ok("completions with token-id prompt");

  const chatLp = await c.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, logprobs: true,
    top_logprobs: 2 });
  const content = chatLp.choices[0].logprobs.content;
  assert.equal(content.length, chatLp.usage.completion_tokens);
  assert.ok(content.every((e) => e.top_logprobs.length === 2 && e.logprob <= 0));
  // "bytes" are what each token stands for: together, the reply's UTF-8 (a token's own text would
  // turn a split character into U+FFFD bytes).
  const whole = Buffer.concat(content.map((e) => Buffer.from(e.bytes)));
  assert.equal(whole.toString("utf8"), chatLp.choices[0].message.content);
  ok("chat logprobs + top_logprobs");

  // Stop sequences: cut the greedy text at a substring it is known to contain.
  const long = await c.completions.create({ model, prompt: "The", max_tokens: 24, temperature: 0 });
  const ltext = long.choices[0].text;
  const cut = ltext.slice(Math.floor(ltext.length / 2)).trim().slice(0, 3);
  if (cut.length > 0) {
    const stopped = await c.completions.create({ model, prompt: "The", max_tokens: 24, temperature: 0, stop: [cut] });
    assert.equal(stopped.choices[0].finish_reason, "stop");
    assert.ok(!stopped.choices[0].text.includes(cut), `stop string ${JSON.stringify(cut)} not emitted`);
    assert.ok(ltext.startsWith(stopped.choices[0].text));
    ok(`stop sequence ${JSON.stringify(cut)}`);
  }

  // Same seed, same sample; n choices come back indexed.
  const sampled = (seed) => c.chat.completions.create({ model, messages, max_tokens: 12, temperature: 1.0, top_p: 0.95,
    top_k: 50, min_p: 0.01, presence_penalty: 0.5, frequency_penalty: 0.5, seed });
  const [a, b] = [await sampled(1234), await sampled(1234)];
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  ok("seed reproducibility");
  const many = await c.chat.completions.create({ model, messages, max_tokens: 4, n: 3, seed: 7 });
  assert.deepEqual(many.choices.map((x) => x.index), [0, 1, 2]);
  ok("n = 3");

  await tools();
  await logitBias();

  const health = await fetch(`${base}/health`);
  assert.equal(health.status, 200);
  const metrics = await (await fetch(`${base}/metrics`)).text();
  for (const m of ["kiln_requests_total", "kiln_time_to_first_token_seconds_bucket", "kiln_kv_blocks_free",
    "kiln_num_requests_running", "kiln_prefix_cache_hit_rate", "kiln_kernel_plan_info"])
    assert.ok(metrics.includes(m), `metrics has ${m}`);
  ok("health and metrics");
}

// kiln-tiny's vocabulary by decoded text: GPT-2's byte-to-character mapping undone.
function byteLevelIds() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = [...bs];
  for (let b = 0, n = 0; b < 256; b++) if (!bs.includes(b)) bs.push(b), cs.push(256 + n++);
  const byteOf = new Map(cs.map((c, i) => [String.fromCodePoint(c), bs[i]]));
  const file = new URL("../../models/kiln-tiny/tokenizer.json", import.meta.url);
  const vocab = JSON.parse(fs.readFileSync(file, "utf8")).model.vocab;
  const out = {};
  for (const [k, id] of Object.entries(vocab)) {
    const bytes = [...k].map((ch) => byteOf.get(ch));
    if (bytes.every((b) => b !== undefined)) out[Buffer.from(bytes).toString("utf8")] ??= id;
  }
  return out;
}

// logit_bias: +100 on one token makes it every choice; the logprob reported with it is the raw
// model's (the same as scoring that token as part of the prompt), not the biased one; -100 bans.
async function logitBias() {
  const c = client();
  const model = await modelName();
  const prefix = [10, 20, 30], X = 501;  // kiln-tiny's "ive"
  const scored = await c.completions.create({ model, prompt: [...prefix, X], max_tokens: 0, echo: true,
    logprobs: 0 });
  const raw = scored.choices[0].logprobs.token_logprobs.at(-1), xText = scored.choices[0].logprobs.tokens.at(-1);
  assert.ok(raw < -1, `token ${X} is not already the likely one (raw logprob ${raw})`);
  const biased = await c.completions.create({ model, prompt: prefix, max_tokens: 3, temperature: 0, logprobs: 0,
    logit_bias: { [X]: 100 } });
  assert.equal(biased.choices[0].text, xText.repeat(3));
  assert.ok(Math.abs(biased.choices[0].logprobs.token_logprobs[0] - raw) < 1e-3,
    `logprob ${biased.choices[0].logprobs.token_logprobs[0]} is the raw ${raw}`);
  const drawn = await c.completions.create({ model, prompt: prefix, max_tokens: 3, temperature: 1, seed: 3,
    logit_bias: { [X]: 100 } });
  assert.equal(drawn.choices[0].text, xText.repeat(3));
  const chat = await c.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 3,
    temperature: 0, logit_bias: { [X]: 100 } });
  assert.equal(chat.choices[0].message.content, xText.repeat(3));
  // -100 on the greedy first token (its id from tokenizer.json's byte-level vocabulary): another one
  // comes, and the greedy one is still reported as the most likely.
  const plain = await c.completions.create({ model, prompt: prefix, max_tokens: 1, temperature: 0, logprobs: 1 });
  const first = plain.choices[0].logprobs.tokens[0];
  const id = byteLevelIds()[first];
  assert.ok(Number.isInteger(id), `id of ${JSON.stringify(first)}`);
  const ban = await c.completions.create({ model, prompt: prefix, max_tokens: 1, temperature: 0, logprobs: 1,
    logit_bias: { [id]: -100 } });
  const blp = ban.choices[0].logprobs;
  assert.notEqual(blp.tokens[0], first);
  assert.ok(first in blp.top_logprobs[0], `the raw top token is still reported: ${JSON.stringify(blp)}`);
  ok("logit_bias: +100 forces a token (greedy and drawn, chat and completions), -100 bans, logprobs stay raw");
}

// Tool calls: tool_choice naming a function or "required" is enforced by constrained decoding
// (the server must run with --tool-call-parser: kiln-tiny's template has no tool format of its
// own); non-streamed and streamed calls agree; the call and its result go back for a reply.
async function tools() {
  const c = client();
  const model = await modelName();
  const messages = [{ role: "user", content: "What is the weather in Paris?" }];
  const tools = [
    { type: "function", function: { name: "get_weather", description: "Weather for a city",
      parameters: { type: "object", properties: { city: { type: "string", maxLength: 12 }, days: { type: "integer" } },
        required: ["city"] } } },
    { type: "function", function: { name: "get_time",
      parameters: { type: "object", properties: { zone: { enum: ["UTC", "CET"] } }, required: ["zone"] } } }];
  const named = { type: "function", function: { name: "get_weather" } };
  const auto = await c.chat.completions.create({ model, messages, tools, tool_choice: "auto", max_tokens: 4,
    temperature: 0 });
  assert.ok(auto.choices[0].message.role === "assistant");
  const none = await c.chat.completions.create({ model, messages, tools, tool_choice: "none", max_tokens: 4,
    temperature: 0 });
  assert.ok(!none.choices[0].message.tool_calls && none.choices[0].finish_reason !== "tool_calls");
  ok("tool_choice auto and none");

  const full = await c.chat.completions.create({ model, messages, tools, tool_choice: named, max_tokens: 400,
    temperature: 0 });
  const msg = full.choices[0].message;
  assert.equal(full.choices[0].finish_reason, "tool_calls", JSON.stringify(full));
  assert.equal(msg.tool_calls.length, 1, JSON.stringify(msg));
  const call = msg.tool_calls[0];
  assert.equal(call.type, "function");
  assert.equal(call.function.name, "get_weather");
  assert.ok(call.id);
  const args = JSON.parse(call.function.arguments);
  assert.equal(typeof args.city, "string");
  assert.ok(args.city.length <= 12);
  ok(`named tool_choice: ${call.function.name}(${call.function.arguments})`);

  const stream = await c.chat.completions.create({ model, messages, tools, tool_choice: named, max_tokens: 400,
    temperature: 0, stream: true });
  const calls = [];
  let finish = null, pieces = 0;
  for await (const chunk of stream)
    for (const ch of chunk.choices) {
      if (ch.finish_reason) finish = ch.finish_reason;
      for (const tc of ch.delta.tool_calls ?? []) {
        // OpenAI's delta form: the first names the call (id, type, name), the rest add arguments (how
        // many pieces depends on how the engine's tokens meet the connection's writes; the parser's
        // test, output_parser_test.cc, pins down that they stream).
        if (!calls[tc.index]) {
          assert.ok(tc.id && tc.type === "function" && tc.function.name, `first delta: ${JSON.stringify(tc)}`);
          calls[tc.index] = { name: tc.function.name, arguments: tc.function.arguments ?? "" };
        } else {
          assert.ok(!tc.id && !tc.function.name && tc.function.arguments, `later delta: ${JSON.stringify(tc)}`);
          calls[tc.index].arguments += tc.function.arguments;
          ++pieces;
        }
      }
    }
  assert.equal(finish, "tool_calls");
  assert.deepEqual(calls, [{ name: "get_weather", arguments: call.function.arguments }]);
  ok(`streamed tool-call deltas concatenate to the same call (arguments in ${pieces} pieces)`);

  const req = await c.chat.completions.create({ model, messages, tools, tool_choice: "required", max_tokens: 400,
    temperature: 0 });
  const rcall = req.choices[0].message.tool_calls?.[0];
  assert.equal(req.choices[0].finish_reason, "tool_calls", JSON.stringify(req));
  assert.ok(["get_weather", "get_time"].includes(rcall.function.name));
  const rargs = JSON.parse(rcall.function.arguments);
  assert.ok(rcall.function.name === "get_weather" ? typeof rargs.city === "string" : ["UTC", "CET"].includes(rargs.zone));
  ok(`tool_choice required: ${rcall.function.name}(${rcall.function.arguments})`);

  // The assistant message as received (content null) and the tool's result go back.
  const reply = await c.chat.completions.create({ model, tools, max_tokens: 8, temperature: 0, messages: [
    ...messages, msg, { role: "tool", tool_call_id: call.id, content: JSON.stringify({ temperature_c: 21 }) }] });
  assert.equal(reply.choices[0].message.role, "assistant");
  assert.equal(typeof reply.choices[0].message.content, "string");
  assert.ok(["stop", "length"].includes(reply.choices[0].finish_reason));
  ok("tool-call round trip: a normal reply after the tool result");
}

async function auth() {
  const key = args["api-key"];
  await assert.rejects(client("wrong-key").models.list(), (e) => e.status === 401);
  await assert.rejects(client("wrong-key").chat.completions.create({ model: "x", messages: [{ role: "user",
    content: "hi" }] }), (e) => e.status === 401);
  const raw = await fetch(`${base}/v1/models`);
  assert.equal(raw.status, 401);
  const body = await raw.json();
  assert.equal(body.error.type, "authentication_error");
  assert.equal((await fetch(`${base}/health`)).status, 200, "/health needs no key");
  assert.equal((await fetch(`${base}/metrics`)).status, 401);
  ok("auth on: missing or wrong key gets 401, /health is open");
  const model = await modelName(key);
  const r = await client(key).chat.completions.create({ model, messages: [{ role: "user", content: "hi" }],
    max_tokens: 2 });
  assert.ok(r.choices.length === 1);
  // The scheme is case-insensitive (RFC 9110); the key is not.
  const lower = await fetch(`${base}/v1/models`, { headers: { Authorization: `bearer ${key}` } });
  assert.equal(lower.status, 200, "'bearer' in lower case");
  const upper = await fetch(`${base}/v1/models`, { headers: { Authorization: `Bearer ${key.toUpperCase()}` } });
  assert.equal(upper.status, 401, "the key is case-sensitive");
  ok("auth on: the right key works");
}

// Requests are cancelled midway by the client (streams after a few events, non-streaming ones
// with --mode json while they wait); afterwards every KV block is free again.
async function disconnect() {
  const model = await modelName();
  const count = Number(args["count"] ?? 100);
  const stream = (args["mode"] ?? "stream") === "stream";
  const metric = async (name) => {
    const t = await (await fetch(`${base}/metrics`)).text();
    return Number(t.split("\n").find((l) => l.startsWith(name + " ")).split(" ")[1]);
  };
  const running = () => metric("kiln_num_requests_running");
  // Used = held by requests (evictable prefix-cache blocks count as free).
  const baseline = await metric("kiln_kv_blocks_used");
  const aborted0 = await metric("kiln_requests_aborted_total");
  await Promise.all(Array.from({ length: count }, async (_, i) => {
    const ctl = new AbortController();
    const res = await fetch(`${base}/v1/completions`, { method: "POST", signal: ctl.signal,
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model, prompt: `request ${i} goes on and on`, max_tokens: 1000, ignore_eos: true,
        stream }) });
    assert.equal(res.status, 200);
    if (stream) {
      const reader = res.body.getReader();
      let got = 0;
      while (got < 3) { const { done, value } = await reader.read(); if (done) break; got += value.length > 0 ? 1 : 0; }
    } else {
      // The headers come at once; the body only when the generation ends. Leave while it runs.
      while (await running() === 0) await new Promise((r) => setTimeout(r, 50));
      await new Promise((r) => setTimeout(r, 200 + 10 * (i % 20)));
    }
    ctl.abort();
  }).map((p) => p.catch((e) => { if (e.name !== "AbortError") throw e; })));
  // The server notices on its next write; wait (bounded) for the engine to drain.
  let used = -1, run = -1;
  for (let i = 0; i < 300; i++) {
    run = await running();
    used = await metric("kiln_kv_blocks_used");
    if (run === 0 && used === baseline) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(run, 0, "no request still running");
  assert.equal(used, baseline, "KV blocks held by requests back to baseline");
  const aborted = await metric("kiln_requests_aborted_total") - aborted0;
  assert.equal(aborted, count, "every request was cancelled, none ran to its end");
  ok(`${count} aborted ${stream ? "streams" : "non-streaming requests"}: KV back to baseline (${baseline} blocks held)`);
  const after = await client().completions.create({ model, prompt: "still", max_tokens: 2 });
  assert.ok(after.choices.length === 1);
  ok("serves after the disconnects");
}

// N concurrent streaming requests: each completes or gets a clear 429/503.
async function load() {
  const model = await modelName();
  const count = Number(args["count"] ?? 1000);
  let completed = 0, refused = 0;
  await Promise.all(Array.from({ length: count }, async (_, i) => {
    const res = await fetch(`${base}/v1/chat/completions`, { method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model, messages: [{ role: "user", content: `hello ${i}` }], max_tokens: 4,
        stream: true }) });
    if (res.status === 429 || res.status === 503) {
      const body = await res.json();
      assert.ok(body.error && body.error.message);
      refused++;
      return;
    }
    assert.equal(res.status, 200);
    const text = await res.text();
    assert.ok(text.trimEnd().endsWith("data: [DONE]"), `stream ${i} ends with [DONE]`);
    completed++;
  }));
  assert.equal(completed + refused, count);
  // Refusing everything is not serving: under the cap the streams must complete.
  const minCompleted = Number(args["min-completed"] ?? 0);
  assert.ok(completed >= minCompleted, `${completed} of ${count} streams completed, fewer than ${minCompleted}`);
  ok(`${count} concurrent streams: ${completed} completed, ${refused} refused`);
}

// response_format json_schema: seeded requests, each answer one object that follows the schema.
async function format() {
  const model = await modelName();
  const count = Number(args["count"] ?? 100);
  const schema = { type: "object", required: ["name", "age", "ok"],
    properties: { name: { type: "string", maxLength: 8 }, age: { type: "integer" }, ok: { type: "boolean" } } };
  const c = client();
  const one = async (i) => {
    const r = await c.chat.completions.create({ model, seed: i, temperature: 1, max_tokens: 300,
      messages: [{ role: "user", content: `person ${i} as JSON` }],
      response_format: { type: "json_schema", json_schema: { name: "person", schema } } });
    const text = r.choices[0].message.content;
    assert.equal(r.choices[0].finish_reason, "stop", `request ${i} ended by itself: ${text}`);
    const j = JSON.parse(text);
    assert.deepEqual(Object.keys(j).sort(), ["age", "name", "ok"], text);
    assert.ok(typeof j.name === "string" && [...j.name].length <= 8, text);
    assert.ok(Number.isInteger(j.age) && typeof j.ok === "boolean", text);
  };
  // Ten at a time: the engine batches them.
  for (let i = 0; i < count; i += 10) await Promise.all(Array.from({ length: Math.min(10, count - i) }, (_, k) => one(i + k)));
  ok(`${count} json_schema answers validate against their schema`);
}

const suites = { e2e, auth, disconnect, load, tools, format };
if (suite === "bad") {
  const { bad } = await import(pathToFileURL(path.join(here, "bad_inputs.mjs")));
  await bad(base, await modelName());
} else {
  await suites[suite]();
}
console.log(`suite ${suite}: all passed`);
process.exit(0);
