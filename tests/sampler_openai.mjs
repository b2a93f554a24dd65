// The unmodified `openai` npm package against Lathe's sampler (tests/sampler_python.py runs it):
// a completion, a chat completion and a streamed completion from one adapter, greedy.
// usage: node tests/sampler_openai.mjs BASE_URL/v1 API_KEY MODEL PROMPT
// Prints {"version", "completion", "chat", "stream"} as JSON.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "reference", "package.json"));
const OpenAI = require("openai").default ?? require("openai");
const version = JSON.parse(readFileSync(path.join(here, "reference", "node_modules", "openai", "package.json"))).version;

const [baseURL, apiKey, model, prompt] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });

const completion = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
const chat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: prompt }], max_tokens: 24, temperature: 0,
});
const stream = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stream: true });
let streamed = "";
for await (const chunk of stream) streamed += chunk.choices[0]?.text ?? "";

console.log(JSON.stringify({
  version,
  completion: completion.choices[0].text,
  chat: chat.choices[0].message.content,
  stream: streamed,
}));
