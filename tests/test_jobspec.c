/* lt_jobspec: one validation for API and upstream submissions; every bad field is named. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "lt_avro.h"
#include "lt_job_record.h"
#include "lt_jobspec.h"

static lt_err_t parse(const char *text, lt_jobspec_t *s, char *field, char *err) {
  json_error_t je;
  json_t *j = json_loads(text, 0, &je);
  cr_assert_not_null(j, "test JSON does not parse: %s", je.text);
  lt_err_t e = lt_jobspec_from_json(j, s, field, 96, err, 256);
  json_decref(j);
  return e;
}

Test(jobspec, minimal_submission_gets_the_documented_defaults) {
  lt_jobspec_t s;
  char field[96], err[256];
  cr_assert_eq(parse("{\"base_model\":\"tiny-llama\",\"dataset_id\":\"ds-1\"}", &s, field, err), LT_OK, "%s", err);
  cr_assert_str_eq(s.base_model, "tiny-llama");
  cr_assert_eq(s.priority, LT_CLASS_STANDARD);
  cr_assert_eq(s.hp.lora_rank, 16);
  cr_assert_float_eq(s.hp.learning_rate, 0.0002, 1e-12);
  cr_assert_eq(s.hp.target_modules, (uint32_t)LT_MODULE_ALL);
}

/* The defaults in lt_jobspec.c must be the Avro schema's, or an upstream record without a
 * field would mean something else than an API submission without it. */
Test(jobspec, defaults_equal_the_schema_defaults) {
  char path[1024];
  snprintf(path, sizeof path, "%s/schemas/JobSubmitted.v3.avsc", getenv("LATHE_SOURCE_ROOT"));
  json_error_t je;
  json_t *schema = json_load_file(path, 0, &je);
  cr_assert_not_null(schema, "%s: %s", path, je.text);
  lt_jobspec_t s;
  lt_jobspec_defaults(&s);
  json_t *spec_json = lt_jobspec_to_json(&s);
  json_t *mine = json_object_get(spec_json, "hyperparameters");
  json_object_set_new(mine, "precision", json_string(lt_precision_name(s.hp.precision))); /* JSON leaves auto out */
  json_t *fields = json_object_get(schema, "fields"), *f, *hp = NULL;
  size_t i;
  json_array_foreach(fields, i, f) {
    if (strcmp(json_string_value(json_object_get(f, "name")), "hyperparameters") == 0)
      hp = json_object_get(json_object_get(f, "type"), "fields");
  }
  cr_assert_not_null(hp);
  int compared = 0;
  json_array_foreach(hp, i, f) {
    const char *name = json_string_value(json_object_get(f, "name"));
    json_t *def = json_object_get(f, "default"), *m = json_object_get(mine, name);
    cr_assert_not_null(m, "hyperparameter %s is in the schema but not in lt_jobspec", name);
    if (json_is_number(def))
      cr_assert_float_eq(json_number_value(def), json_number_value(m), 1e-12, "default of %s", name);
    else
      cr_assert(json_equal(def, m), "default of %s differs from the schema", name);
    compared++;
  }
  cr_assert_eq(compared, (int)json_object_size(mine), "lt_jobspec has hyperparameters the schema lacks");
  json_decref(spec_json);
  json_decref(schema);
}

Test(jobspec, every_bad_field_is_named) {
  struct { const char *body, *field, *words; } cases[] = {
      {"{\"dataset_id\":\"d\"}", "base_model", "required"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"../etc/passwd\"}", "dataset_id", "A-Z"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"hyperparameters\":{\"learning_rate\":5}}",
       "hyperparameters.learning_rate", "above the maximum 1"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"hyperparameters\":{\"learning_rate\":0}}",
       "hyperparameters.learning_rate", "below the minimum"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"hyperparameters\":{\"lora_rank\":2.5}}",
       "hyperparameters.lora_rank", "whole number"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"hyperparameters\":{\"lora_rank\":\"8\"}}",
       "hyperparameters.lora_rank", "must be a number"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"hyperparameters\":{\"precision\":\"fp8\"}}",
       "hyperparameters.precision", "\"auto\", \"f32\" or \"bf16\""},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"hyperparameters\":{\"precision\":16}}",
       "hyperparameters.precision", "\"bf16\""},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"hyperparameters\":{\"lr\":0.1}}",
       "hyperparameters.lr", "not a known hyperparameter"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"hyperparameters\":{\"target_modules\":[\"q_proj\",\"attn\"]}}",
       "hyperparameters.target_modules", "unknown module"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"priority\":\"urgent\"}", "priority", "production"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"gpus\":64}", "gpus", "above the maximum 8"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"tenant_id\":\"other\"}", "tenant_id", "not a known field"},
      {"[1,2]", "(body)", "JSON object"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"suffix\":\"my model\"}", "suffix", "up to 64 characters"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"suffix\":\"-x\"}", "suffix", "not starting"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"metadata\":[1]}", "metadata", "object of strings"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"metadata\":{\"team\":7}}", "metadata.team", "must be a string"},
      {"{\"base_model\":\"m\",\"dataset_id\":\"d\",\"metadata\":{\"a\":\"1\",\"b\":\"2\",\"c\":\"3\",\"d\":\"4\","
       "\"e\":\"5\",\"f\":\"6\",\"g\":\"7\",\"h\":\"8\",\"i\":\"9\",\"j\":\"10\",\"k\":\"11\",\"l\":\"12\",\"m\":\"13\","
       "\"n\":\"14\",\"o\":\"15\",\"p\":\"16\",\"q\":\"17\"}}", "metadata", "over the limit of 16"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    lt_jobspec_t s;
    char field[96] = "", err[256] = "";
    cr_assert_eq(parse(cases[i].body, &s, field, err), LT_ERR_INVALID, "case %zu accepted", i);
    cr_assert_str_eq(field, cases[i].field, "case %zu: %s", i, err);
    cr_assert(strstr(err, cases[i].words), "case %zu: \"%s\" lacks \"%s\"", i, err, cases[i].words);
  }
}

/* a, written as JSON and read back, is a again, byte for byte. */
static void same_after_json(const lt_jobspec_t *a) {
  lt_jobspec_t b;
  char field[96], err[256];
  json_t *j = lt_jobspec_to_json(a);
  cr_assert_eq(lt_jobspec_from_json(j, &b, field, sizeof field, err, sizeof err), LT_OK, "%s", err);
  json_decref(j);
  cr_assert_eq(memcmp(a, &b, sizeof b), 0);
}

Test(jobspec, to_json_and_back_is_the_same_spec) {
  lt_jobspec_t a, b;
  char field[96], err[256];
  cr_assert_eq(parse("{\"base_model\":\"m\",\"dataset_id\":\"d\",\"priority\":\"preemptible\","
                     "\"hyperparameters\":{\"lora_rank\":4,\"target_modules\":[\"q_proj\",\"v_proj\"],"
                     "\"lr_schedule\":\"linear\",\"seed\":99}}", &a, field, err), LT_OK, "%s", err);
  json_t *j = lt_jobspec_to_json(&a);
  cr_assert_eq(lt_jobspec_from_json(j, &b, field, sizeof field, err, sizeof err), LT_OK, "%s", err);
  json_decref(j);
  cr_assert_eq(memcmp(&a, &b, sizeof a), 0);
  cr_assert_eq(b.hp.target_modules, (uint32_t)(LT_MODULE_Q | LT_MODULE_V));
  cr_assert_eq(b.hp.seed, 99);
}

/* A job's precision goes from the API's JSON into its record and back; auto (the default) stays
 * out of the JSON, so every job from before it shows and digests as it did; a record an upstream
 * service forged with a precision that is none is refused, naming the field. */
Test(jobspec, precision_survives_json_and_the_record_and_auto_stays_out_of_json) {
  lt_jobspec_t a, c;
  char field[96], err[256];
  cr_assert_eq(parse("{\"base_model\":\"m\",\"dataset_id\":\"d\"}", &a, field, err), LT_OK, "%s", err);
  cr_assert_eq(a.hp.precision, LT_PRECISION_AUTO);
  json_t *j = lt_jobspec_to_json(&a);
  cr_assert_null(json_object_get(json_object_get(j, "hyperparameters"), "precision"));
  json_decref(j);
  cr_assert_eq(parse("{\"base_model\":\"m\",\"dataset_id\":\"d\",\"hyperparameters\":{\"precision\":\"bf16\"}}", &a,
                     field, err), LT_OK, "%s", err);
  cr_assert_eq(a.hp.precision, LT_PRECISION_BF16);
  j = lt_jobspec_to_json(&a);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "hyperparameters"), "precision")), "bf16");
  json_decref(j);
  same_after_json(&a);
  lt_avro_registry_t *reg;
  lt_avro_record_t *rec;
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK, "%s", err);
  const char *types[] = {"JobSubmitted", "JobDispatched"};
  for (int t = 0; t < 2; t++) {
    cr_assert_eq(lt_avro_record_new(reg, types[t], &rec, err, sizeof err), LT_OK, "%s", err);
    for (lt_precision_t p = LT_PRECISION_AUTO; p <= LT_PRECISION_BF16; p++) {
      a.hp.precision = p;
      cr_assert_eq(lt_jobspec_to_record(&a, rec, err, sizeof err), LT_OK, "%s", err);
      cr_assert_eq(lt_jobspec_from_record(rec, &c, err, sizeof err), LT_OK, "%s", err);
      cr_assert_eq(c.hp.precision, p, "%s: %s came back as %s", types[t], lt_precision_name(p),
                   lt_precision_name(c.hp.precision));
    }
    cr_assert_eq(lt_avro_set_string(rec, "hyperparameters.precision", "fp8"), LT_OK);
    cr_assert_eq(lt_jobspec_from_record(rec, &c, err, sizeof err), LT_ERR_INVALID, "%s", types[t]);
    cr_assert(strstr(err, "hyperparameters.precision") && strstr(err, "fp8"), "%s", err);
    lt_avro_record_destroy(rec);
  }
  lt_avro_registry_destroy(reg);
}

Test(jobspec, suffix_and_metadata_survive_json_and_the_record) {
  lt_jobspec_t a, b, c;
  char field[96], err[256];
  char big[600];
  memset(big, 'v', 512);
  big[512] = '\0';
  char body[1200];
  snprintf(body, sizeof body, "{\"base_model\":\"m\",\"dataset_id\":\"d\",\"suffix\":\"%s\","
           "\"metadata\":{\"team\":\"search\",\"long\":\"%s\"}}",
           "s012345678901234567890123456789012345678901234567890123456789012", big);
  cr_assert_eq(parse(body, &a, field, err), LT_OK, "%s", err);
  cr_assert_eq(strlen(a.suffix), 64);
  cr_assert_eq(a.nmeta, 2);
  same_after_json(&a);
  lt_avro_registry_t *reg;
  lt_avro_record_t *rec;
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_new(reg, "JobSubmitted", &rec, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_jobspec_to_record(&a, rec, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_jobspec_from_record(rec, &c, err, sizeof err), LT_OK, "%s", err);
  cr_assert_str_eq(c.suffix, a.suffix);
  cr_assert_eq(c.nmeta, 2);
  cr_assert_str_eq(c.meta[0].key, "team");
  cr_assert_str_eq(c.meta[0].value, "search");
  cr_assert_str_eq(c.meta[1].value, big);
  /* 513 bytes: one over. */
  big[512] = 'v';
  big[513] = '\0';
  snprintf(body, sizeof body, "{\"base_model\":\"m\",\"dataset_id\":\"d\",\"metadata\":{\"k\":\"%s\"}}", big);
  cr_assert_eq(parse(body, &b, field, err), LT_ERR_INVALID);
  cr_assert_str_eq(field, "metadata.k");
  lt_avro_record_destroy(rec);
  lt_avro_registry_destroy(reg);
}

/* Found by tests/fuzz/fuzz_jobspec: a JobSubmitted record's metadata key that was not UTF-8
 * passed validation, and the job's JSON view silently had no metadata. */
Test(jobspec, metadata_a_json_view_cannot_show_is_refused_from_a_record) {
  lt_jobspec_t s;
  char field[96], err[256];
  cr_assert_eq(parse("{\"base_model\":\"m\",\"dataset_id\":\"d\",\"metadata\":{\"a\":\"1\",\"b\":\"2\"}}", &s,
                     field, err), LT_OK, "%s", err);
  cr_assert_eq(lt_jobspec_validate(&s, field, sizeof field, err, sizeof err), LT_OK, "%s", err);
  snprintf(s.meta[1].key, sizeof s.meta[1].key, "tea\xed");
  cr_assert_eq(lt_jobspec_validate(&s, field, sizeof field, err, sizeof err), LT_ERR_INVALID);
  cr_assert_str_eq(field, "metadata");
  snprintf(s.meta[1].key, sizeof s.meta[1].key, "b");
  snprintf(s.meta[1].value, sizeof s.meta[1].value, "\xc3(");
  cr_assert_eq(lt_jobspec_validate(&s, field, sizeof field, err, sizeof err), LT_ERR_INVALID, "a value not UTF-8");
  snprintf(s.meta[1].key, sizeof s.meta[1].key, "a");
  snprintf(s.meta[1].value, sizeof s.meta[1].value, "2");
  cr_assert_eq(lt_jobspec_validate(&s, field, sizeof field, err, sizeof err), LT_ERR_INVALID, "a key twice");
  cr_assert(strstr(err, "twice"), "%s", err);
}

Test(jobspec, ids_refuse_paths_and_options) {
  cr_assert(lt_id_valid("job-01.a_b"));
  const char *bad[] = {"", "..", ".hidden", "-rf", "a/b", "a b", "é", "x\n"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) cr_assert(!lt_id_valid(bad[i]), "%s", bad[i]);
  char longid[80];
  memset(longid, 'a', 64);
  longid[64] = 0;
  cr_assert(!lt_id_valid(longid));
}

/* A base model is an id or a Hugging Face id ORG/NAME: one slash, each side an id, never a path. */
Test(jobspec, base_models_take_hub_ids_and_refuse_paths) {
  const char *good[] = {"lathe-tiny", "HuggingFaceTB/SmolLM2-135M", "Qwen/Qwen2.5-0.5B-Instruct"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) cr_expect(lt_model_id_valid(good[i]), "%s", good[i]);
  const char *bad[] = {"", "/abs", "org/", "/name", "a/b/c", "../x", "org/..", "org/.hidden", "a//b", "org/-rf", "a b/c"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) cr_expect(!lt_model_id_valid(bad[i]), "%s", bad[i]);
  lt_jobspec_t s;
  char field[96], err[256];
  cr_expect_eq(parse("{\"base_model\":\"HuggingFaceTB/SmolLM2-135M\",\"dataset_id\":\"d\"}", &s, field, err), LT_OK,
               "%s", err);
  cr_expect_str_eq(s.base_model, "HuggingFaceTB/SmolLM2-135M");
  cr_expect_eq(parse("{\"base_model\":\"../../etc\",\"dataset_id\":\"d\"}", &s, field, err), LT_ERR_INVALID);
  cr_expect_str_eq(field, "base_model");
  cr_expect(strstr(err, "ORG/NAME"), "%s", err);
}
