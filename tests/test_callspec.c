/* Tests of a session call's checks (src/lib/lt_callspec.h): what the API refuses before anything
 * is stored or recorded, each refusal naming the field as a path. */
#include <string.h>

#include <criterion/criterion.h>

#include "lt_callspec.h"

static const lt_callspec_limits_t LIM = {.vocab_size = 100, .max_tokens_per_call = 64};

/* The field named when text is refused ("" when accepted). */
static const char *refused(const char *text) {
  static char field[128];
  char msg[320];
  const char *kind = NULL;
  json_t *body = lt_callspec_parse(text, strlen(text), field, sizeof field, msg, sizeof msg);
  if (!body) return field[0] ? field : "(parse)";
  lt_err_t err = lt_callspec_check(body, &LIM, &kind, field, sizeof field, msg, sizeof msg);
  json_decref(body);
  if (err) cr_assert(strstr(msg, field), "the message names the field: %s", msg);
  return err ? field : "";
}

Test(callspec, good_calls_of_every_kind_pass) {
  cr_assert_str_eq(refused("{\"kind\":\"forward_backward\",\"data\":[{\"tokens\":[1,2],\"targets\":[2,3]}]}"), "");
  cr_assert_str_eq(refused("{\"kind\":\"forward\",\"loss\":\"ppo\",\"loss_config\":{\"clip_low\":0.1},\"data\":[{\"tokens\""
                           ":[1,2],\"targets\":[2,-100],\"weights\":[1,0],\"logprobs\":[-1,-2],\"advantages\":[0.5,0]}]}"),
                   "", "a masked target may be -100");
  cr_assert_str_eq(refused("{\"kind\":\"optim_step\",\"adam\":{\"lr\":0.001,\"grad_clip\":1}}"), "");
  cr_assert_str_eq(refused("{\"kind\":\"save_state\",\"name\":\"s1\"}"), "");
  cr_assert_str_eq(refused("{\"kind\":\"sample\",\"prompts\":[[1,2]],\"num_samples\":4,\"max_tokens\":8,\"stop\":[0]}"), "");
}

Test(callspec, bad_calls_name_the_field) {
  cr_assert_str_eq(refused("{\"kind\":\"forward_backward\",\"data\":[{\"tokens\":[1,100],\"targets\":[2,3]}]}"),
                   "data[0].tokens[1]", "a token id outside the vocabulary");
  cr_assert_str_eq(refused("{\"kind\":\"forward_backward\",\"data\":[{\"tokens\":[1,2],\"targets\":[2,300]}]}"),
                   "data[0].targets[1]", "a weighted target outside the vocabulary");
  cr_assert_str_eq(refused("{\"kind\":\"forward_backward\",\"data\":[]}"), "data");
  cr_assert_str_eq(refused("{\"kind\":\"forward_backward\",\"data\":[{\"tokens\":[1,2],\"targets\":[2,3],\"weights\":[1]}]}"),
                   "data[0].weights");
  cr_assert_str_eq(refused("{\"kind\":\"forward_backward\",\"data\":[{\"tokens\":[1],\"targets\":[2],\"wieghts\":[1]}]}"),
                   "data[0].wieghts", "a misspelt field is refused, not ignored");
  cr_assert_str_eq(refused("{\"kind\":\"forward_backward\",\"loss\":\"ppo\",\"data\":[{\"tokens\":[1],\"targets\":[2]}]}"),
                   "data[0].logprobs", "a policy loss needs the sampler's log-probs");
  cr_assert_str_eq(refused("{\"kind\":\"forward_backward\",\"loss_config\":{\"clip_low\":0.1},\"data\":[{\"tokens\":[1],"
                           "\"targets\":[2]}]}"),
                   "loss_config", "a clip range is for ppo only");
  cr_assert_str_eq(refused("{\"kind\":\"forward_backward\",\"data\":[{\"tokens\":[1,2,3,4,5,6,7,8,9],\"targets\":[1,1,1,"
                           "1,1,1,1,1,1]},{\"tokens\":[1],\"targets\":[1]},{\"tokens\":[1],\"targets\":[1]},{\"tokens\":"
                           "[1],\"targets\":[1]},{\"tokens\":[1],\"targets\":[1]},{\"tokens\":[1],\"targets\":[1]},"
                           "{\"tokens\":[1],\"targets\":[1]},{\"tokens\":[1],\"targets\":[1]}]}"),
                   "data", "8 examples padded to 9 tokens exceed 64 tokens a call");
  cr_assert_str_eq(refused("{\"kind\":\"optim_step\",\"adam\":{\"lr\":2}}"), "adam.lr");
  cr_assert_str_eq(refused("{\"kind\":\"optim_step\",\"adam\":{}}"), "adam.lr");
  cr_assert_str_eq(refused("{\"kind\":\"optim_step\",\"adam\":{\"lr\":1,\"weight_decay\":10}}"), "adam.weight_decay",
                   "a decay of 1 - lr x weight_decay = -9 would flip the weights' sign");
  cr_assert_str_eq(refused("{\"kind\":\"load_state\",\"name\":\"../x\"}"), "name");
  cr_assert_str_eq(refused("{\"kind\":\"sample\",\"prompts\":[[]]}"), "prompts[0]");
  cr_assert_str_eq(refused("{\"kind\":\"sample\",\"prompts\":[[1]],\"num_samples\":2.5}"), "num_samples");
  cr_assert_str_eq(refused("{\"kind\":\"end\"}"), "kind", "the end is DELETE, not a call");
  cr_assert_str_eq(refused("[1,2]"), "body");
}

Test(callspec, a_nan_or_an_infinity_is_named_by_its_path) {
  cr_assert_str_eq(refused("{\"kind\":\"forward_backward\",\"loss\":\"importance_sampling\",\"data\":[{\"tokens\":[1,2],"
                           "\"targets\":[2,3]},{\"tokens\":[1,2],\"targets\":[2,3],\"logprobs\":[-1,-1],"
                           "\"advantages\":[0.5, NaN]}]}"),
                   "data[1].advantages[1]");
  cr_assert_str_eq(refused("{\"kind\":\"optim_step\",\"adam\":{\"lr\":-Infinity}}"), "adam.lr");
  cr_assert_str_eq(refused("{\"kind\": nope}"), "(parse)", "other bad JSON says where, naming no field");
}

/* Found by tests/fuzz/fuzz_http: the NaN/Infinity check compared past the body's length (the API
 * NUL-terminates its bodies, so there it read the terminator; the contract is len bytes). */
Test(callspec, a_body_is_read_within_its_length) {
  const char text[] = "{\"adam\":NaN}";
  char field[64], msg[256];
  json_t *body = lt_callspec_parse(text, 10, field, sizeof field, msg, sizeof msg); /* "{"adam":Na" */
  cr_assert_null(body);
  cr_assert(strstr(msg, "not valid JSON"), "a cut NaN is not a NaN: %s", msg);
  cr_assert_str_eq(field, "");
  body = lt_callspec_parse(text, 0, field, sizeof field, msg, sizeof msg);
  cr_assert_null(body);
  cr_assert(strstr(msg, "not valid JSON"), "%s", msg);
}

/* What runs on a state that holds every call up to `held`: the calls after it, and the end the
 * state was taken for (a final checkpoint whose completion was lost: chaos seed 6703). The worker
 * handed that end over, but the executor, going by its own rule (seq <= held: answered, not
 * run), refused it and the session never ended; both go by this one now. */
Test(callspec, a_state_held_up_to_a_call_runs_what_comes_after_and_its_own_end) {
  cr_expect(lt_callspec_runs_after("forward_backward", 8, 7));
  cr_expect(lt_callspec_runs_after("end", 8, 7));
  cr_expect(lt_callspec_runs_after("end", 7, 7), "the end the final checkpoint was taken for");
  cr_expect(!lt_callspec_runs_after("save_state", 7, 7), "the save the checkpoint was taken for");
  cr_expect(!lt_callspec_runs_after("forward_backward", 7, 7));
  cr_expect(!lt_callspec_runs_after("end", 6, 7), "an end before the state: the state ran past it");
  cr_expect(!lt_callspec_runs_after(NULL, 7, 7));
  cr_expect(lt_callspec_runs_after("optim_step", 1, 0), "a fresh attempt runs its first call");
}
