// The unmodified `openai` npm package against Lathe's OpenAI-compatible fine-tuning API
// (tests/openai_ft_python.py runs it): files.create -> fineTuning.jobs.create -> list -> listEvents
// -> poll to succeeded -> checkpoints.list, a cancelled job, files and models listed, and the
// errors the package raises for bad requests.
// usage: node tests/openai_ft.mjs BASE_URL/v1 API_KEY TRAIN.jsonl
// Prints one JSON object of what it saw.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "reference", "package.json"));
const openai = require("openai");
const OpenAI = openai.default ?? openai;
const version = JSON.parse(readFileSync(path.join(here, "reference", "node_modules", "openai", "package.json"))).version;

const [baseURL, apiKey, trainPath] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
const out = { version };

const file = await client.files.create({
  file: await openai.toFile(readFileSync(trainPath), "train.jsonl"), purpose: "fine-tune",
});
out.file = file;
out.file_retrieved = await client.files.retrieve(file.id);
out.files = [];
for await (const f of client.files.list()) out.files.push(f.id);

const job = await client.fineTuning.jobs.create({
  model: "lathe-tiny", training_file: file.id, suffix: "npm-test", seed: 7, metadata: { team: "ci" },
  hyperparameters: { n_epochs: 1, batch_size: 8, learning_rate_multiplier: 15 },
});
out.created = job;

// A second job, cancelled at once.
const doomed = await client.fineTuning.jobs.create({ model: "lathe-tiny", training_file: file.id });
await client.fineTuning.jobs.cancel(doomed.id);

const listed = await client.fineTuning.jobs.list({ limit: 10 });
out.listed = listed.data.map((j) => j.id);

const deadline = Date.now() + 600000;
let now = job, cancelled = doomed;
while (Date.now() < deadline) {
  now = await client.fineTuning.jobs.retrieve(job.id);
  cancelled = await client.fineTuning.jobs.retrieve(doomed.id);
  if (["succeeded", "failed", "cancelled"].includes(now.status) && cancelled.status !== "queued" &&
      cancelled.status !== "running" && cancelled.status !== "validating_files") break;
  await new Promise((r) => setTimeout(r, 1000));
}
out.final = now;
out.cancelled = cancelled;
out.events = [];
for await (const e of client.fineTuning.jobs.listEvents(job.id, { limit: 5 })) out.events.push(e);
out.checkpoints = [];
for await (const c of client.fineTuning.jobs.checkpoints.list(job.id)) out.checkpoints.push(c);
out.models = (await client.models.list()).data.map((m) => m.id);

// Errors come back as the package's APIError with OpenAI's status, type and param.
async function error(f) {
  try {
    await f();
    return null;
  } catch (e) {
    return { status: e.status, type: e.type ?? e.error?.type, param: e.param ?? e.error?.param, code: e.code,
             message: e.error?.message ?? e.message };
  }
}
out.errors = {
  model: await error(() => client.fineTuning.jobs.create({ model: "no-such-model", training_file: file.id })),
  file: await error(() => client.fineTuning.jobs.create({ model: "lathe-tiny", training_file: "file-nope" })),
  hp: await error(() => client.fineTuning.jobs.create({
    model: "lathe-tiny", training_file: file.id, hyperparameters: { n_epochs: 0 } })),
  unknown: await error(() => client.fineTuning.jobs.retrieve("ftjob-nope")),
  purpose: await error(async () => client.files.create({
    file: await openai.toFile(Buffer.from("{}\n"), "x.jsonl"), purpose: "assistants" })),
  bad_file: await error(async () => client.files.create({
    file: await openai.toFile(Buffer.from('{"prompt": "a"}\n'), "bad.jsonl"), purpose: "fine-tune" })),
  // a filename names the dataset: one over 100 bytes is refused, not dropped for the file's id
  long_name: await error(async () => client.files.create({
    file: await openai.toFile(Buffer.from('{"prompt": "a", "completion": "b"}\n'), "n".repeat(150) + ".jsonl"),
    purpose: "fine-tune" })),
  // the multiplier is checked as sent, not as the learning rate it makes
  multiplier: await error(() => client.fineTuning.jobs.create({
    model: "lathe-tiny", training_file: file.id, hyperparameters: { learning_rate_multiplier: 10000 } })),
};
console.log(JSON.stringify(out));
