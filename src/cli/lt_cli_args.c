/* lt_cli_args: getopt_long under the rules every `lathe` command shares (see lt_cli_args.h). */
#include "lt_cli_args.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum { O_HELP = 0x7fff };

/* Copies the caller's options, adds --help, builds the short options ("h", then each letter val,
 * with ':' when it takes a value) and resets getopt for a fresh argv. */
static void args_start(lt_cli_args_t *a) {
  size_t n = 0, s = 0;
  a->shorts[s++] = ':'; /* a missing value returns ':', not '?' */
  a->shorts[s++] = 'h';
  for (const struct option *o = a->opts; o && o->name; o++) {
    assert(n < LT_CLI_ARGS_MAX - 1 && !o->flag);
    a->all[n++] = *o;
    if (o->val < 128 && ((o->val | 32) >= 'a' && (o->val | 32) <= 'z')) {
      a->shorts[s++] = (char)o->val;
      if (o->has_arg == required_argument) a->shorts[s++] = ':';
    }
  }
  a->all[n++] = (struct option){"help", no_argument, NULL, O_HELP};
  a->all[n] = (struct option){0};
  a->shorts[s] = '\0';
  a->started = true;
  optind = 0; /* glibc: 0 starts over completely, forgetting an earlier argv */
  opterr = 0; /* the messages are ours */
}

/* The option's text as typed, for a message: "--url" of "--url=x", or "-o". */
static void option_text(int argc, char **argv, char *out, size_t n) {
  const char *t = optind > 0 && optind <= argc ? argv[optind - 1] : NULL;
  if (t && strncmp(t, "--", 2) == 0) snprintf(out, n, "%.*s", (int)strcspn(t, "="), t);
  else snprintf(out, n, "-%c", optopt ? optopt : '?');
}

static int args_error(lt_cli_args_t *a, int argc, char **argv, const char *fmt) {
  char opt[128];
  option_text(argc, argv, opt, sizeof opt);
  fprintf(stderr, "lathe %s: ", a->what);
  fprintf(stderr, fmt, opt);
  fprintf(stderr, "\n");
  a->usage(stderr);
  a->status = 2;
  return LT_CLI_ARGS_STOP;
}

int lt_cli_args_next(lt_cli_args_t *a, int argc, char **argv) {
  if (!a->started) args_start(a);
  a->value = NULL;
  int c = getopt_long(argc, argv, a->shorts, a->all, NULL);
  if (c == 'h' || c == O_HELP) {
    a->usage(stdout);
    a->status = 0;
    return LT_CLI_ARGS_STOP;
  }
  if (c == ':') return args_error(a, argc, argv, "%s needs a value");
  if (c == '?') {
    const char *t = optind > 0 && optind <= argc ? argv[optind - 1] : "";
    return args_error(a, argc, argv, optopt && strchr(t, '=') ? "%s takes no value" : "unknown option \"%s\"");
  }
  if (c != -1) {
    a->value = optarg;
    return c;
  }
  a->operands = argv + optind;
  a->noperands = argc - optind;
  if (a->noperands < a->min || a->noperands > a->max) {
    if (a->noperands > a->max) fprintf(stderr, "lathe %s: unexpected argument \"%s\"\n", a->what, a->operands[a->max]);
    else fprintf(stderr, "lathe %s: missing an argument\n", a->what);
    a->usage(stderr);
    a->status = 2;
    return LT_CLI_ARGS_STOP;
  }
  return LT_CLI_ARGS_END;
}

int lt_cli_args_fail(const lt_cli_args_t *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "lathe %s: ", a->what);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  return 2;
}

bool lt_cli_args_num(const lt_cli_args_t *a, const char *name, double min, double max, bool whole, double *out) {
  char *end = NULL;
  double d = a->value ? strtod(a->value, &end) : NAN;
  if (!end || end == a->value || *end || !(d >= min && d <= max) || (whole && d != floor(d))) {
    lt_cli_args_fail(a, "%s must be a %s from %g to %g, not \"%s\"", name, whole ? "whole number" : "number", min, max,
                     a->value ? a->value : "");
    return false;
  }
  *out = d;
  return true;
}

/* Is t one of the common options? *value: whether it takes its value from the next argument. */
static bool common_option(const struct option *common, const char *t, bool *value) {
  for (const struct option *o = common; o && o->name; o++) {
    size_t n = strlen(o->name);
    bool is_long = strncmp(t, "--", 2) == 0 && strncmp(t + 2, o->name, n) == 0 && (!t[2 + n] || t[2 + n] == '=');
    if (is_long || (t[1] == o->val && !t[2])) {
      *value = o->has_arg == required_argument && !strchr(t, '=');
      return true;
    }
  }
  return false;
}

int lt_cli_args_dispatch(const char *what, void (*usage)(FILE *f), const lt_cli_verb_t *verbs, size_t nverbs,
                         const struct option *common, int argc, char **argv) {
  int v = 1;
  for (; v < argc; v++) {
    const char *t = argv[v];
    if (strcmp(t, "--help") == 0 || strcmp(t, "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if (t[0] != '-' || !t[1]) break;
    bool value;
    if (!common_option(common, t, &value)) {
      fprintf(stderr, "lathe %s: unknown option \"%s\"\n", what, t);
      usage(stderr);
      return 2;
    }
    v += value;
  }
  if (v >= argc) {
    if (argc > 1) fprintf(stderr, "lathe %s: which command? (see lathe %s --help)\n", what, what);
    usage(stderr);
    return 2;
  }
  for (size_t i = 0; i < nverbs; i++) {
    if (strcmp(argv[v], verbs[i].name) != 0) continue;
    char *verb = argv[v]; /* the verb first, the options that came before it after it */
    memmove(argv + 2, argv + 1, (size_t)(v - 1) * sizeof *argv);
    argv[1] = verb;
    return verbs[i].fn(argc - 1, argv + 1);
  }
  fprintf(stderr, "lathe %s: unknown command \"%s\"\n", what, argv[v]);
  usage(stderr);
  return 2;
}
