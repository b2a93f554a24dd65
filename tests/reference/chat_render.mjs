// Reference renderer for tests/test_chat.c: @huggingface/jinja, an independent Jinja
// implementation, renders each case of a cases file (tests/data/chat_templates/cases.json:
// {name, template (a file beside the cases file), messages, add_generation_prompt, bos_token,
// eos_token}) and prints [{name, output}] or [{name, error}] as JSON.
// @huggingface/jinja's Template tokenizes with lstrip_blocks and trim_blocks on and drops one
// trailing newline: transformers' ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True) with Jinja's keep_trailing_newline=False.
//   node chat_render.mjs CASES.json
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { Template } from "@huggingface/jinja";

const path = process.argv[2];
const cases = JSON.parse(readFileSync(path, "utf8"));
const out = cases.map((c) => {
  const text = readFileSync(join(dirname(path), c.template), "utf8");
  try {
    const output = new Template(text).render({
      messages: c.messages,
      add_generation_prompt: c.add_generation_prompt,
      bos_token: c.bos_token,
      eos_token: c.eos_token,
    });
    return { name: c.name, output };
  } catch (e) {
    return { name: c.name, error: String(e.message) };
  }
});
process.stdout.write(JSON.stringify(out, null, 1) + "\n");
