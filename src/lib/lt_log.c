/* lt_log: one log line per call, text or JSON (see lt_log.h).
 *
 * The format, role and instance are process-wide (set once by lathed's main before any thread
 * starts, read-only after), the one piece of global state here: every role of a process shares
 * one stderr, so they share its format too. */
#include "lt_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MSG_MAX 16384 /* a message's bytes kept; the line adds ids and escapes */

static struct {
  lt_log_format_t format;
  char role[32];
  char instance[128];
} conf;

void lt_log_setup(lt_log_format_t format, const char *role, const char *instance) {
  conf.format = format;
  snprintf(conf.role, sizeof conf.role, "%s", role ? role : "");
  snprintf(conf.instance, sizeof conf.instance, "%s", instance ? instance : "");
}

bool lt_log_format_parse(const char *text, lt_log_format_t *out) {
  if (text && strcmp(text, "text") == 0) *out = LT_LOG_TEXT;
  else if (text && strcmp(text, "json") == 0) *out = LT_LOG_JSON;
  else return false;
  return true;
}

lt_log_format_t lt_log_format(void) { return conf.format; }

/* A line being built in a fixed buffer; what does not fit is dropped (the newline never is). */
typedef struct {
  char *b;
  size_t len, cap;
} line_t;

static void put(line_t *l, const char *s, size_t n) {
  if (n > l->cap - l->len) n = l->cap - l->len;
  memcpy(l->b + l->len, s, n);
  l->len += n;
}

static void puts_(line_t *l, const char *s) { put(l, s, strlen(s)); }

/* The length of the well-formed UTF-8 character at s (n bytes left), 0 if it is not one. */
static size_t utf8_len(const unsigned char *s, size_t n) {
  size_t k = s[0] < 0x80 ? 1 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : s[0] >= 0xe0 && s[0] < 0xf0 ? 3
           : s[0] >= 0xf0 && s[0] < 0xf5 ? 4 : 0;
  if (!k || k > n) return 0;
  for (size_t i = 1; i < k; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  if (k == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0))) return 0;
  if (k == 4 && ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))) return 0;
  return k;
}

/* s as a JSON string's contents: quotes, backslashes and control characters escaped, bytes that
 * are not UTF-8 (an error text from a library may hold any) as U+FFFD, so every line parses. */
static void put_json(line_t *l, const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s);
  while (n && l->cap - l->len >= 8) { /* room kept for what closes the object */
    char esc[8];
    size_t k = utf8_len(p, n);
    if (k == 1 && (*p == '"' || *p == '\\')) {
      esc[0] = '\\', esc[1] = (char)*p;
      put(l, esc, 2);
    } else if (k == 1 && *p < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", *p);
      puts_(l, esc);
    } else if (k) {
      put(l, (const char *)p, k);
    } else {
      puts_(l, "\\ufffd");
      k = 1;
    }
    p += k, n -= k;
  }
}

static void put_field(line_t *l, const char *name, const char *value) {
  if (!value || !*value) return;
  puts_(l, ",\"");
  puts_(l, name);
  puts_(l, "\":\"");
  put_json(l, value);
  puts_(l, "\"");
}

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void lt_log(lt_log_level_t level, const char *role, const lt_log_ids_t *ids, const char *fmt, ...) {
  char msg[MSG_MAX], buf[MSG_MAX + 1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t mlen = strlen(msg);
  while (mlen && msg[mlen - 1] == '\n') msg[--mlen] = '\0'; /* callers that still end in \n */
  for (char *p = msg; (p = strchr(p, '\n'));) *p = ' ';
  line_t l = {buf, 0, sizeof buf - 1};
  if (conf.format == LT_LOG_TEXT) {
    puts_(&l, role ? "lathed " : "lathed");
    if (role) puts_(&l, role);
    puts_(&l, ": ");
    puts_(&l, msg);
  } else {
    struct timespec ts;
    struct tm tm;
    char when[40];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t w = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + w, sizeof when - w, ".%03ldZ", ts.tv_nsec / 1000000);
    puts_(&l, "{\"ts\":\"");
    puts_(&l, when);
    puts_(&l, "\",\"level\":\"");
    puts_(&l, level_names[level <= LT_LOG_ERROR ? level : LT_LOG_ERROR]);
    puts_(&l, "\"");
    put_field(&l, "role", role ? role : conf.role[0] ? conf.role : "lathed");
    put_field(&l, "instance", conf.instance);
    if (ids) {
      put_field(&l, "job", ids->job);
      put_field(&l, "tenant", ids->tenant);
      put_field(&l, "session", ids->session);
      if (ids->attempt > 0) {
        char a[24];
        snprintf(a, sizeof a, ",\"attempt\":%d", (int)ids->attempt);
        puts_(&l, a);
      }
    }
    puts_(&l, ",\"msg\":\"");
    put_json(&l, msg);
    puts_(&l, "\"}");
  }
  buf[l.len++] = '\n';
  /* One write: lines from different threads never mix. A failed write has nowhere to go. */
  ssize_t rc = write(STDERR_FILENO, buf, l.len);
  (void)rc;
}
