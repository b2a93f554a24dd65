/* lathe: the command-line tool for customers and operators.
 *
 * main() only dispatches: each subcommand is one line in lt_cli_commands[] and one function
 * `int lt_cli_<name>(int argc, char **argv)` (argv[0] is the subcommand's name) that returns the
 * process exit status: 0 success, 1 failure (message on stderr), 2 usage error. A subsystem adds
 * its command by declaring its function below, adding a table line, and putting the function in
 * its own source file listed in lathe_cli_src (src/cli/meson.build).
 *
 * `lathe record` (here): encode JSON to Avro single-object bytes, decode them back, list the
 * schemas — the debugging tool operators and tests use on Lathe's topics. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_avro.h"
#include "lt_cli_args.h"
#include "lt_config.h"

typedef int (*lt_cli_fn)(int argc, char **argv);

/* Subcommands: declare, then add a line to the table. */
int lt_cli_record(int argc, char **argv);
int lt_cli_topic(int argc, char **argv);
int lt_cli_sim(int argc, char **argv);
int lt_cli_admin(int argc, char **argv);
int lt_cli_model(int argc, char **argv);
int lt_cli_train(int argc, char **argv);
int lt_cli_jobs(int argc, char **argv);
int lt_cli_sessions(int argc, char **argv);
int lt_cli_datasets(int argc, char **argv);
int lt_cli_access(int argc, char **argv);
int lt_cli_usage(int argc, char **argv);

static const struct {
  const char *name;
  lt_cli_fn fn;
  const char *summary;
} lt_cli_commands[] = {
    {"record", lt_cli_record, "encode, decode and list Avro records (debugging)"},
    {"topic", lt_cli_topic, "tail a topic as JSON lines; produce JSON lines as records"},
    {"model", lt_cli_model, "make the bundled base model (lathe-tiny)"},
    {"train", lt_cli_train, "run a managed fine-tune locally (no broker, no store)"},
    {"admin", lt_cli_admin, "operators: tenants and API keys, replay, the queue"},
    {"sim", lt_cli_sim, "simulate the scheduling policy over a trace (Lathe, FIFO, LAS; sim gen)"},
    {"jobs", lt_cli_jobs, "customers: submit, list, show, cancel, watch jobs; their checkpoints, artifacts"},
    {"sessions", lt_cli_sessions, "customers: list, show, end and cancel training sessions (over the API)"},
    {"datasets", lt_cli_datasets, "customers: upload, list, show and delete datasets (over the API)"},
    {"access", lt_cli_access, "customers: see, approve, deny and revoke staff access to your data"},
    {"usage", lt_cli_usage, "customers: your quotas and what you use against each"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: lathe COMMAND [ARGS...]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof lt_cli_commands / sizeof lt_cli_commands[0]; i++)
    fprintf(f, "  %-10s %s\n", lt_cli_commands[i].name, lt_cli_commands[i].summary);
  fprintf(f, "\n`lathe COMMAND --help` describes a command. lathe %s\n", LT_VERSION);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("lathe %s\n", LT_VERSION);
    return 0;
  }
  for (size_t i = 0; i < sizeof lt_cli_commands / sizeof lt_cli_commands[0]; i++)
    if (strcmp(argv[1], lt_cli_commands[i].name) == 0) return lt_cli_commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "lathe: unknown command \"%s\"\n\n", argv[1]);
  usage(stderr);
  return 2;
}

/* ---- lathe record ---- */

static void record_usage(FILE *f) {
  fprintf(f,
          "usage: lathe record encode TYPE < record.json > record.avro\n"
          "       lathe record decode [--value] < record.avro\n"
          "       lathe record schemas [--canonical]\n"
          "\n"
          "encode  writes the JSON object on stdin as one Avro single-object message (C3 01,\n"
          "        fingerprint, body) of the newest version of TYPE; fields with a default may be\n"
          "        left out; nullable fields take null or the value.\n"
          "decode  reads one single-object message from stdin and prints one JSON line:\n"
          "        {\"type\",\"version\" (the writer's),\"fingerprint\",\"value\"} — the value\n"
          "        resolved to the newest version; --value prints only the value.\n"
          "schemas lists every schema version: name, version, fingerprint (hex of the 8 header\n"
          "        bytes), whether it is the newest; --canonical adds the Parsing Canonical Form.\n");
}

static int read_all(FILE *f, char **out, size_t *len) {
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  if (!buf) return ENOMEM;
  for (;;) {
    if (n == cap) {
      char *p = realloc(buf, cap * 2);
      if (!p) {
        free(buf);
        return ENOMEM;
      }
      buf = p;
      cap *= 2;
    }
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (r == 0) break;
  }
  if (ferror(f)) {
    free(buf);
    return EIO;
  }
  *out = buf;
  *len = n;
  return 0;
}

static int record_encode(const lt_avro_registry_t *reg, const char *type) {
  char err[512];
  lt_avro_record_t *rec = NULL;
  char *in = NULL;
  size_t inlen = 0;
  int status = 1;
  if (lt_avro_record_new(reg, type, &rec, err, sizeof err)) {
    fprintf(stderr, "lathe record encode: %s\n", err);
    return 1;
  }
  if (read_all(stdin, &in, &inlen)) {
    fprintf(stderr, "lathe record encode: cannot read stdin\n");
    goto out;
  }
  if (lt_avro_record_from_json(rec, in, inlen, err, sizeof err)) {
    fprintf(stderr, "lathe record encode: %s\n", err);
    goto out;
  }
  const uint8_t *bytes;
  size_t len;
  if (lt_avro_record_encode(rec, &bytes, &len, err, sizeof err)) {
    fprintf(stderr, "lathe record encode: %s\n", err);
    goto out;
  }
  if (fwrite(bytes, 1, len, stdout) != len || fflush(stdout)) {
    fprintf(stderr, "lathe record encode: cannot write stdout\n");
    goto out;
  }
  status = 0;
out:
  free(in);
  lt_avro_record_destroy(rec);
  return status;
}

static int record_decode(const lt_avro_registry_t *reg, int value_only) {
  char err[512];
  char *in = NULL, *json = NULL;
  size_t inlen = 0;
  int status = 1;
  lt_avro_decoder_t *dec = NULL;
  lt_avro_record_t *rec;
  if (read_all(stdin, &in, &inlen)) {
    fprintf(stderr, "lathe record decode: cannot read stdin\n");
    return 1;
  }
  lt_err_t rc = lt_avro_decoder_new(reg, &dec, err, sizeof err);
  if (!rc) rc = lt_avro_decode(dec, in, inlen, &rec, err, sizeof err);
  if (!rc) rc = lt_avro_record_to_json(rec, &json, err, sizeof err);
  if (rc) {
    fprintf(stderr, "lathe record decode: %s (%s)\n", err, lt_err_name(rc));
    goto out;
  }
  if (value_only) {
    printf("%s\n", json);
  } else {
    uint64_t fp = 0;
    char hex[17];
    lt_avro_peek(in, inlen, &fp, NULL, 0);
    lt_avro_fingerprint_hex(fp, hex);
    printf("{\"type\":\"%s\",\"version\":%d,\"fingerprint\":\"%s\",\"value\":%s}\n",
           lt_avro_record_type(rec), lt_avro_record_writer_version(rec), hex, json);
  }
  status = fflush(stdout) ? 1 : 0;
out:
  free(json);
  free(in);
  lt_avro_decoder_destroy(dec);
  return status;
}

static int record_schemas(const lt_avro_registry_t *reg, int canonical) {
  for (size_t i = 0; i < lt_avro_registry_count(reg); i++) {
    const lt_avro_schema_t *s = lt_avro_registry_at(reg, i);
    char hex[17];
    lt_avro_fingerprint_hex(lt_avro_schema_fingerprint(s), hex);
    printf("%-22s v%-3d %s%s", lt_avro_schema_name(s), lt_avro_schema_version(s), hex,
           lt_avro_schema_is_latest(s) ? "  latest" : "");
    if (canonical) printf("  %s", lt_avro_schema_canonical(s, NULL));
    printf("\n");
  }
  return fflush(stdout) ? 1 : 0;
}

/* encode TYPE, decode [--value], schemas [--canonical]. */
static int record_verb(int argc, char **argv) {
  bool encode = strcmp(argv[0], "encode") == 0, decode = strcmp(argv[0], "decode") == 0;
  static const struct option decode_opts[] = {{"value", no_argument, NULL, 256}, {0}};
  static const struct option schemas_opts[] = {{"canonical", no_argument, NULL, 256}, {0}};
  char what[32], err[512];
  snprintf(what, sizeof what, "record %s", argv[0]);
  lt_cli_args_t a = {.what = what, .usage = record_usage, .opts = encode ? NULL : decode ? decode_opts : schemas_opts,
                     .min = encode, .max = encode};
  bool flag = false;
  int c;
  while ((c = lt_cli_args_next(&a, argc, argv)) >= 0) flag = true;
  if (c != LT_CLI_ARGS_END) return a.status;
  lt_avro_registry_t *reg;
  if (lt_avro_registry_new(&reg, err, sizeof err)) {
    fprintf(stderr, "lathe record: %s\n", err);
    return 1;
  }
  int status = encode ? record_encode(reg, a.operands[0]) : decode ? record_decode(reg, flag) : record_schemas(reg, flag);
  lt_avro_registry_destroy(reg);
  return status;
}

int lt_cli_record(int argc, char **argv) {
  static const lt_cli_verb_t verbs[] = {{"encode", record_verb}, {"decode", record_verb}, {"schemas", record_verb}};
  return lt_cli_args_dispatch("record", record_usage, verbs, 3, NULL, argc, argv);
}
