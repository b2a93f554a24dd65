/* Tests of the pure parts of the API's OpenAI routes (src/control/lt_api_openai.c): a create
 * body mapped onto a job spec, with refusals in OpenAI's words, and multipart bodies. The routes
 * themselves run against the real stack in tests/openai_ft_python.py. */
#include <criterion/criterion.h>
#include <string.h>

#include "lt_api_int.h"

static bool spec_of(const char *body, lt_jobspec_t *spec, char *field, char *msg) {
  return lt_api_openai_job_spec(body, strlen(body), spec, field, LT_API_FIELD_MAX, msg, 512);
}

Test(api_openai, a_create_body_maps_onto_the_spec) {
  lt_jobspec_t spec;
  char field[LT_API_FIELD_MAX], msg[512];
  cr_assert(spec_of("{\"model\":\"lathe-tiny\",\"training_file\":\"ds-1\",\"seed\":7,\"hyperparameters\":"
                    "{\"n_epochs\":3,\"batch_size\":\"auto\",\"learning_rate_multiplier\":2}}",
                    &spec, field, msg), "%s", msg);
  cr_assert_str_eq(spec.base_model, "lathe-tiny");
  cr_assert_str_eq(spec.dataset_id, "ds-1");
  cr_assert_eq(spec.hp.epochs, 3);
  cr_assert_eq(spec.hp.seed, 7);
  cr_assert_float_eq(spec.hp.learning_rate, 0.0004, 1e-12);
}

Test(api_openai, refusals_name_openais_fields) {
  lt_jobspec_t spec;
  char field[LT_API_FIELD_MAX], msg[512];
  cr_assert_not(spec_of("{\"model\":\"lathe-tiny\",\"training_file\":\"ds-1\",\"hyperparameters\":{\"n_epochs\":0}}",
                        &spec, field, msg));
  cr_assert_str_eq(field, "hyperparameters.n_epochs");
  cr_assert(strncmp(msg, "hyperparameters.n_epochs", 24) == 0, "%s", msg);
  cr_assert_not(spec_of("{\"model\":\"lathe-tiny\",\"traning_file\":\"ds-1\"}", &spec, field, msg));
  cr_assert_str_eq(field, "traning_file");
  cr_assert_str_eq(msg, "traning_file: is not a known field");
  cr_assert_not(spec_of("[1]", &spec, field, msg));
  cr_assert_str_eq(field, "");
  cr_assert_str_eq(msg, "the body must be a JSON object (not an object)");
  cr_assert_not(spec_of("{\"model\":\"m\",\"training_file\":\"d\",\"hyperparameters\":{\"batch_size\":\"big\"}}",
                        &spec, field, msg));
  cr_assert_str_eq(field, "hyperparameters.batch_size");
  cr_assert_str_eq(msg, "hyperparameters.batch_size: must be a number or \"auto\"");
  /* the multiplier is checked as sent, not as the learning rate it makes; the seed is top-level */
  cr_assert_not(spec_of("{\"model\":\"m\",\"training_file\":\"d\",\"hyperparameters\":"
                        "{\"learning_rate_multiplier\":10000}}",
                        &spec, field, msg));
  cr_assert_str_eq(field, "hyperparameters.learning_rate_multiplier");
  cr_assert_str_eq(msg, "hyperparameters.learning_rate_multiplier: 10000 is outside (0, 5000]: it multiplies the "
                        "base learning rate 0.0002");
  cr_assert_not(spec_of("{\"model\":\"m\",\"training_file\":\"d\",\"hyperparameters\":"
                        "{\"learning_rate_multiplier\":0}}",
                        &spec, field, msg));
  cr_assert_str_eq(field, "hyperparameters.learning_rate_multiplier");
  cr_assert(spec_of("{\"model\":\"m\",\"training_file\":\"d\",\"hyperparameters\":{\"learning_rate_multiplier\":5000}}",
                    &spec, field, msg), "%s", msg);
  cr_assert_not(spec_of("{\"model\":\"m\",\"training_file\":\"d\",\"seed\":-1}", &spec, field, msg));
  cr_assert_str_eq(field, "seed");
  cr_assert(strncmp(msg, "seed: ", 6) == 0, "%s", msg);
}

Test(api_openai, multipart_parts_point_into_the_body) {
  const char *ct = "multipart/form-data; boundary=\"XyZ\"";
  char boundary[80];
  cr_assert(lt_api_header_param(ct, "boundary", boundary, sizeof boundary));
  cr_assert_str_eq(boundary, "XyZ");
  const char body[] = "--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n"
                      "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"t.jsonl\"\r\n\r\n"
                      "{}\n\r\n--XyZ--";
  lt_api_form_part_t parts[8];
  int n = 0;
  cr_assert(lt_api_form_parse(body, sizeof body - 1, boundary, parts, 8, &n));
  cr_assert_eq(n, 2);
  cr_assert_str_eq(parts[0].name, "purpose");
  cr_assert_eq(parts[0].len, 9);
  cr_assert_str_eq(parts[1].filename, "t.jsonl");
  cr_assert_eq(parts[1].len, 3);
  cr_assert_not(lt_api_form_parse(body, sizeof body - 6, boundary, parts, 8, &n), "cut before the closing delimiter");
}
