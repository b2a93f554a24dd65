/* lt_conf: lathed's configuration from a file and flags; precedence flag > environment > file;
 * every bad line named; librdkafka properties passed through to lt_bus and checked there. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
  unsetenv("LATHE_TEST_A");
  unsetenv("LATHE_TEST_B");
  unsetenv("LATHE_TEST_C");
  unsetenv("LATHE_KAFKA_PROPERTIES");
  if (path[0]) unlink(path);
}

TestSuite(conf, .init = clean, .fini = clean);

Test(conf, a_file_sets_what_the_environment_does_not_and_a_flag_wins_over_both) {
  write_file("# Lathe\n\n  LATHE_TEST_A = from file  \nLATHE_TEST_B=from file\nLATHE_TEST_C=file\n"
             "kafka.socket.timeout.ms=30000\nkafka.client.rack = r1\n");
  setenv("LATHE_TEST_B", "from env", 1);
  setenv("LATHE_TEST_C", "from env", 1);
  char *argv[] = {"lathed", "--set", "LATHE_TEST_C=from flag", "--role", "api", "--config", path, NULL};
  int argc = 7;
  cr_assert_eq(lt_conf_from_args(&argc, argv, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(argc, 3, "--config and --set are taken out of argv");
  cr_assert_str_eq(argv[1], "--role");
  cr_assert_str_eq(argv[2], "api");
  cr_assert_null(argv[3]);
  cr_assert_str_eq(getenv("LATHE_TEST_A"), "from file", "trimmed");
  cr_assert_str_eq(getenv("LATHE_TEST_B"), "from env", "the environment wins over the file");
  cr_assert_str_eq(getenv("LATHE_TEST_C"), "from flag", "a flag wins over the environment, in any order");
  cr_assert_str_eq(getenv("LATHE_KAFKA_PROPERTIES"), "socket.timeout.ms=30000\nclient.rack=r1");
  /* The properties reach the bus configuration, after the environment's. */
  lt_bus_conf_t *c = lt_bus_conf_new();
  cr_assert_eq(lt_bus_conf_from_env(c, err, sizeof err), LT_OK, "%s", err);
  lt_bus_conf_destroy(c);
}

Test(conf, every_bad_line_is_named_by_file_and_line) {
  const char *cases[][2] = {
      {"LATHE_TEST_A=1\nnot a setting\n", ":2: \"not a setting\" is not NAME=VALUE"},
      {"HOME=/tmp\n", ":1: \"HOME\" is neither a LATHE_ setting"},
      {"lathe_test_a=1\n", ":1: \"lathe_test_a\" is neither"},
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
