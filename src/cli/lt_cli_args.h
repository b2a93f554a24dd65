/* lt_cli_args: how every `lathe` command reads its arguments — getopt_long under one set of rules,
 * so that no command parses by hand:
 *
 *   - `--help` or `-h` anywhere prints the command's usage on stdout: exit status 0;
 *   - an unknown option, an option without its value, or a missing or extra operand is named on
 *     stderr ("lathe jobs submit: --model needs a value"), followed by the usage: exit status 2;
 *   - options and operands come in any order (GNU getopt permutes; "--" ends the options).
 *
 * An option whose val is an ASCII letter also has that short form (-o FILE, -q); long-only
 * options take vals >= 256. Not a library API: only the CLI uses it. Single-threaded (getopt's
 * state is global). */
#ifndef LT_CLI_ARGS_H
#define LT_CLI_ARGS_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define LT_CLI_ARGS_MAX 40 /* options of one command, --help included */

enum {
  LT_CLI_ARGS_END = -1,  /* no more options: the operands are a->operands[0..a->noperands) */
  LT_CLI_ARGS_STOP = -2, /* --help or a usage error, said: return a->status */
};

/* One parse. Fill the first fields (a designated initializer), then call lt_cli_args_next until it
 * returns a negative value. */
typedef struct lt_cli_args {
  const char *what;            /* "jobs submit": messages begin "lathe jobs submit: " */
  void (*usage)(FILE *f);      /* the command's usage */
  const struct option *opts;   /* ends with {0}; NULL: none; --help and -h are added */
  int min, max;                /* how many operands the command takes */
  /* out */
  const char *value;           /* the value of the option lt_cli_args_next returned, else NULL */
  char **operands;             /* after LT_CLI_ARGS_END: the operands, in order (into argv) */
  int noperands;
  int status;                  /* after LT_CLI_ARGS_STOP: the exit status (0 --help, 2 usage) */
  /* private */
  bool started;
  struct option all[LT_CLI_ARGS_MAX + 1];
  char shorts[2 * LT_CLI_ARGS_MAX + 4];
} lt_cli_args_t;

/* The next option of argv[1..argc) (argv[0] is the command's name; getopt may reorder argv): its
 * val, with a->value set when it takes one; LT_CLI_ARGS_END after the last, the operands counted
 * and checked against min and max; LT_CLI_ARGS_STOP after --help or a usage error. */
int lt_cli_args_next(lt_cli_args_t *a, int argc, char **argv);

/* A usage error the command found itself (a value out of range, options that do not go
 * together): prints "lathe WHAT: <message>" on stderr and returns 2. */
int lt_cli_args_fail(const lt_cli_args_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A number for the option now being read (a->value): within min..max, whole when whole is true;
 * false after saying which option and what it takes. */
bool lt_cli_args_num(const lt_cli_args_t *a, const char *name, double min, double max, bool whole, double *out);

/* A command with verbs: `lathe jobs submit ...`. */
typedef struct lt_cli_verb {
  const char *name;
  int (*fn)(int argc, char **argv); /* argv[0] is the verb; returns the exit status */
} lt_cli_verb_t;

/* Runs the verb of argv[1..argc): the first operand, where options of `common` (ends with {0};
 * NULL: none) may come before it and are handed on to the verb, after it. --help or -h before the
 * verb prints usage on stdout (0); no verb or an unknown one is a usage error (2). */
int lt_cli_args_dispatch(const char *what, void (*usage)(FILE *f), const lt_cli_verb_t *verbs, size_t nverbs,
                         const struct option *common, int argc, char **argv);

#endif
