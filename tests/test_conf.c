/* lt_conf: lathed's configuration from a file and flags; precedence flag > environment > file;
 * every bad line named; librdkafka properties passed through to lt_bus and checked there. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lt_bus.h"
#include "lt_conf.h"
#include "lt_test.h"

static char path[64];
static char err[1024];

static void write_file(const char *text) {
  snprintf(path, sizeof path, "/tmp/lt-conf-%d.conf", (int)getpid());
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
}

static void clean(void) {
  unsetenv("LATHE_TOPIC_PREFIX");
  unsetenv("LATHE_INSTANCE");
  unsetenv("LATHE_MODELS_DIR");
  unsetenv("LATHE_KAFKA_PROPERTIES");
  if (path[0]) unlink(path);
}

TestSuite(conf, .init = clean, .fini = clean);

Test(conf, a_file_sets_what_the_environment_does_not_and_a_flag_wins_over_both) {
  write_file("# Lathe\n\n  LATHE_TOPIC_PREFIX = from file  \nLATHE_INSTANCE=from file\nLATHE_MODELS_DIR=file\n"
             "kafka.socket.timeout.ms=30000\nkafka.client.rack = r1\n");
  setenv("LATHE_INSTANCE", "from env", 1);
  setenv("LATHE_MODELS_DIR", "from env", 1);
  char *argv[] = {"lathed", "--set", "LATHE_MODELS_DIR=from flag", "--role", "api", "--config", path, NULL};
  int argc = 7;
  cr_assert_eq(lt_conf_from_args(&argc, argv, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(argc, 3, "--config and --set are taken out of argv");
  cr_assert_str_eq(argv[1], "--role");
  cr_assert_str_eq(argv[2], "api");
  cr_assert_null(argv[3]);
  cr_assert_str_eq(getenv("LATHE_TOPIC_PREFIX"), "from file", "trimmed");
  cr_assert_str_eq(getenv("LATHE_INSTANCE"), "from env", "the environment wins over the file");
  cr_assert_str_eq(getenv("LATHE_MODELS_DIR"), "from flag", "a flag wins over the environment, in any order");
  cr_assert_str_eq(getenv("LATHE_KAFKA_PROPERTIES"), "socket.timeout.ms=30000\nclient.rack=r1");
  /* The properties reach the bus configuration, after the environment's. */
  lt_bus_conf_t *c = lt_bus_conf_new();
  cr_assert_eq(lt_bus_conf_from_env(c, err, sizeof err), LT_OK, "%s", err);
  lt_bus_conf_destroy(c);
}

Test(conf, every_bad_line_is_named_by_file_and_line) {
  const char *cases[][2] = {
      {"LATHE_TOPIC_PREFIX=1\nnot a setting\n", ":2: \"not a setting\" is not NAME=VALUE"},
      {"HOME=/tmp\n", ":1: \"HOME\" is neither a LATHE_ setting"},
      {"lathe_test_a=1\n", ":1: \"lathe_test_a\" is neither"},
      {"LATHE_WORKER_SLOT=2\n", ":1: LATHE_WORKER_SLOT is no setting Lathe reads (did you mean LATHE_WORKER_SLOTS?)"},
      {"\nLATHE_KILL_DEADLINE=30000\n", ":2: LATHE_KILL_DEADLINE is no setting Lathe reads (did you mean LATHE_KILL_DEADLINE_MS?)"},
      {"LATHE_FROBNICATE=1\n", ":1: LATHE_FROBNICATE is no setting Lathe reads; lathed --help lists every one"},
      {"\n\nkafka.socket.timeout.ms=\n", ":3: kafka.socket.timeout.ms has no value"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    write_file(cases[i][0]);
    cr_expect_eq(lt_conf_load_file(path, err, sizeof err), LT_ERR_INVALID, "case %zu", i);
    cr_expect(strstr(err, path) && strstr(err, cases[i][1]), "case %zu: %s", i, err);
  }
  cr_expect_eq(lt_conf_load_file("/nonexistent/lathed.conf", err, sizeof err), LT_ERR_IO);
  cr_expect(strstr(err, "/nonexistent/lathed.conf"), "%s", err);
  int argc = 2;
  char *argv[] = {"lathed", "--set", NULL};
  cr_expect_eq(lt_conf_from_args(&argc, argv, err, sizeof err), LT_ERR_INVALID);
  cr_expect(strstr(err, "--set needs a value"), "%s", err);
}

/* The settings lt_conf knows are exactly the LATHE_ names the code reads: a name added to the code
 * and not to the table would be refused in a file, one left in the table would hide a typo. */
Test(conf, the_known_settings_are_the_names_the_code_reads) {
  char cmd[1024];
  const char *root = getenv("LATHE_SOURCE_ROOT") ? getenv("LATHE_SOURCE_ROOT") : ".";
  snprintf(cmd, sizeof cmd, "cd '%s' && grep -rhoE '\"LATHE_[A-Z0-9_]+' src workers --exclude=lt_conf.c | "
           "tr -d '\"' | sort -u", root);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  char line[128];
  size_t in_code = 0;
  while (fgets(line, sizeof line, p)) {
    line[strcspn(line, "\n")] = '\0';
    in_code++;
    cr_expect(lt_conf_known(line), "%s is read in the code and not known to lt_conf", line);
  }
  cr_assert_eq(pclose(p), 0, "grep in %s failed", root);
  size_t known = 0;
  while (lt_conf_name(known)) known++;
  cr_expect_eq(known, in_code, "lt_conf knows %zu settings, the code reads %zu", known, in_code);
  cr_expect_gt(in_code, 50, "the grep found too few names to be the tree's");
  /* and lathed --help lists every one, as the refusal says */
  snprintf(cmd, sizeof cmd, "'%s' --help", lt_test_lathed_bin());
  int rc;
  char *help = lt_test_run(cmd, &rc);
  cr_expect_eq(rc, 0, "%s", help);
  for (size_t i = 0; lt_conf_name(i); i++) cr_expect(strstr(help, lt_conf_name(i)), "--help lacks %s", lt_conf_name(i));
  free(help);
}

Test(conf, an_unknown_kafka_property_stops_lathed_naming_it) {
  write_file("kafka.no.such.property=1\n");
  char cmd[512];
  snprintf(cmd, sizeof cmd, "'%s' --config '%s' --role publisher 2>&1", lt_test_lathed_bin(), path);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  char out[4096] = "";
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int rc = pclose(p);
  cr_expect_neq(rc, 0, "lathed started: %s", out);
  cr_expect(strstr(out, "no.such.property"), "%s", out);
}

/* lathed's output and exit status for a command line with an empty environment of keys (so that a
 * setting it accepts lets it go on to refuse the missing master key instead). */
static int lathed_says(const char *args, char *out, size_t n) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "env -u LATHE_MASTER_KEY -u LATHE_MASTER_KEY_FILE timeout 30 '%s' %s --port 0 "
           "--operator-port 0 2>&1", lt_test_lathed_bin(), args);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t got = fread(out, 1, n - 1, p);
  out[got] = '\0';
  int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* A LATHE_ name in the environment a couple of edits from a setting is a typo that would leave the
 * setting at its default: lathed says so, naming both, and goes on (the environment may hold other
 * tools' LATHE_ names, which it leaves alone: ops/stack's LATHE_STACK_DIR is three edits from
 * LATHE_STORE_DIR). */
Test(conf, a_typo_of_a_setting_in_the_environment_is_named_with_the_setting_it_is_near) {
  setenv("LATHE_API_THREAD", "4", 1);
  setenv("LATHE_SAMPLER_KVMB", "64", 1);
  setenv("LATHE_STACK_DIR", "/nowhere", 1);
  char out[4096];
  int rc = lathed_says("--role api", out, sizeof out);
  unsetenv("LATHE_API_THREAD");
  unsetenv("LATHE_SAMPLER_KVMB");
  unsetenv("LATHE_STACK_DIR");
  cr_expect(rc == 1 && strstr(out, "master key"), "lathed went on to the missing master key: exit %d: %s", rc, out);
  cr_expect(strstr(out, "LATHE_API_THREAD is set in the environment") && strstr(out, "did you mean LATHE_API_THREADS?"),
            "%s", out);
  cr_expect(strstr(out, "LATHE_SAMPLER_KVMB is set") && strstr(out, "did you mean LATHE_SAMPLER_KV_MB?"), "%s", out);
  cr_expect(!strstr(out, "LATHE_STACK_DIR"), "another tool's name was taken for a typo: %s", out);
}

/* A numeric setting or a switch that lathed cannot read stops it (exit 2) before any role starts,
 * naming the setting and what it should be, whether it came from the environment, a --config
 * file or --set: "30s" was 30 ms to atoi, "two" slots and "yes" were the defaults. Good values of
 * every kind pass (lathed goes on to the missing master key), -1 where it means "never" and 0
 * where it means the default among them. */
Test(conf, a_setting_lathed_cannot_read_stops_it_naming_the_setting) {
  const char *bad[][2] = {
      {"LATHE_KILL_DEADLINE_MS=30s", "milliseconds"}, {"LATHE_WORKER_SLOTS=two", "slots"},
      {"LATHE_API_THREADS=-2", "from -1 to 256"},      {"LATHE_SAMPLER_KV_MB=99999999999999999999", "MiB"},
      {"LATHE_LEASE_MS=1e3", "milliseconds"},         {"LATHE_GC_GRACE_MS=-5", "milliseconds"},
      {"LATHE_SCHEDULER_PORT=70000", "a port"},       {"LATHE_ACCESS_SECOND_STAFF=yes", "1 (on) or 0 (off)"},
      {"LATHE_PUBLISHER_LOG_COMMITS=true", "1 (on) or 0 (off)"}, {"LATHE_PREEMPT_AFTER_S=nan", "seconds"},
      {"LATHE_SAMPLER_THREADS=257", "from 0 to 256"}, {"LATHE_SESSION_IDLE_MS=-2", "-1: never parked"},
      {"LATHE_PREEMPT_AFTER_S=-3", "-1: never preempt"}, {"LATHE_LOG_FORMAT=yaml", "text or json"}};
  char args[512], out[4096];
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(strchr(bad[i][0], '=') - bad[i][0]), bad[i][0]);
    for (int how = 0; how < 3; how++) {
      if (how == 0) snprintf(args, sizeof args, "--role all --set '%s'", bad[i][0]);
      if (how == 1) {
        write_file(bad[i][0]);
        snprintf(args, sizeof args, "--config '%s' --role worker", path);
      }
      if (how == 2) snprintf(args, sizeof args, "--role api");
      if (how == 2) setenv(name, strchr(bad[i][0], '=') + 1, 1);
      int rc = lathed_says(args, out, sizeof out);
      if (how == 2) unsetenv(name);
      cr_expect(rc == 2 && strstr(out, name) && strstr(out, bad[i][1]) && !strstr(out, "listening") &&
                    !strstr(out, "master key"),
                "%s (%s): exit %d: %s", bad[i][0], how == 0 ? "--set" : how == 1 ? "--config" : "environment", rc, out);
    }
  }
  write_file("LATHE_KILL_DEADLINE_MS=30000\nLATHE_WORKER_SLOTS=2\nLATHE_API_THREADS=-1\nLATHE_PREEMPT_AFTER_S=0.5\n"
             "LATHE_ACCESS_SECOND_STAFF=0\nLATHE_PUBLISHER_LOG_COMMITS=1\nLATHE_SAMPLER_KV_MB=\n"
             "LATHE_SCHEDULER_PORT=0\nLATHE_API_MAX_STORAGE_BYTES=1152921504606846976\nLATHE_SESSION_IDLE_MS=-1\n"
             "LATHE_KEEP_CHECKPOINTS=-1\nLATHE_WORKER_THREADS=0\nLATHE_SAMPLER_THREADS=0\n");
  snprintf(args, sizeof args, "--config '%s' --role all --set LATHE_PREEMPT_AFTER_S=-1", path);
  int rc = lathed_says(args, out, sizeof out);
  cr_expect(rc == 1 && strstr(out, "master key"), "good settings were refused: exit %d: %s", rc, out);
}
