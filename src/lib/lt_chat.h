/* lt_chat: a base model's own chat template (a Jinja subset) rendered in C.
 *
 * /v1/chat/completions turns `messages` into a prompt with the `chat_template` of the base
 * model's tokenizer_config.json, never a hard-coded one. The subset is what the published
 * templates of SmolLM2, Qwen2/2.5, Llama-3, Mistral-Instruct and Zephyr use: output and block
 * tags, if/elif/else, for with `loop`, set (with namespace()), whitespace control, comments,
 * literals, attribute/subscript/slice access, arithmetic, comparison and logic, tests, a few
 * filters and string methods, and raise_exception(). The environment is transformers': trim_blocks
 * and lstrip_blocks on, one trailing newline of the template dropped. Rendering is bounded
 * (1 MiB of output, a fixed number of evaluation steps, a nesting depth), so no input loops
 * forever or exhausts the stack. tests/test_chat.c holds it byte for byte to @huggingface/jinja.
 *
 * Threads: no shared state; any thread may call, on different or the same inputs. */
#ifndef LT_CHAT_H
#define LT_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "lt_err.h"

/* Renders `tmpl` (a Jinja chat template) with `messages` (borrowed: a JSON array of {role, content}
 * objects, content a string), add_generation_prompt, bos_token and eos_token (NULL is "").
 * On success *out is malloc'd NUL-terminated text the caller frees. A template that uses
 * something outside the subset fails LT_ERR_UNSUPPORTED, one that is malformed or calls
 * raise_exception() fails LT_ERR_INVALID; errstr names the construct and its line and column. */
lt_err_t lt_chat_render(const char *tmpl, const json_t *messages, bool add_generation_prompt,
                        const char *bos_token, const char *eos_token, char **out, char *errstr,
                        size_t errstr_size);

/* Reads chat_template, bos_token and eos_token from the text of a tokenizer_config.json. Tokens
 * may be strings or {"content": ...} objects; chat_template may be a string or a list of
 * {name, template} (the one named "default" is taken). *tmpl, *bos and *eos are malloc'd (the
 * caller frees); a missing token is "" and a missing chat_template fails LT_ERR_NOT_FOUND. */
lt_err_t lt_chat_config_parse(const char *json_text, size_t len, char **tmpl, char **bos,
                              char **eos, char *errstr, size_t errstr_size);

#endif
