/* lt_bus_admin: topic administration for the Kafka module (create from ops/topics.tsv,
 * describe, list, delete). Used by ops tooling, tests and daemons that check their topics at
 * start. Every call is idempotent where Kafka allows: an existing topic is not an error. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lt_bus_int.h"
#include "lt_time.h"

struct lt_bus_admin {
  rd_kafka_t *rk;
  lt_bus_conf_t *conf;
};

lt_err_t lt_bus_admin_new(const lt_bus_conf_t *conf, lt_bus_admin_t **out, char *errstr,
                          size_t errstr_size) {
  static const char *const defaults[] = {"log.connection.close", "false", NULL};
  *out = NULL;
  lt_bus_admin_t *a = calloc(1, sizeof *a);
  if (!a) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  a->conf = lt_bus_conf_dup(conf);
  rd_kafka_conf_t *rc = a->conf ? lt_bus_rk_conf(conf, defaults, NULL, errstr, errstr_size) : NULL;
  a->rk = rc ? lt_bus_rk_new(RD_KAFKA_PRODUCER, rc, "admin", errstr, errstr_size) : NULL;
  if (a->rk) {
    *out = a;
    return LT_OK;
  }
  lt_bus_admin_destroy(a);
  return LT_ERR_INVALID;
}

rd_kafka_t *lt_bus_admin_rk(lt_bus_admin_t *a) { return a->rk; }

const lt_bus_conf_t *lt_bus_admin_conf(const lt_bus_admin_t *a) { return a->conf; }

void lt_bus_admin_destroy(lt_bus_admin_t *a) {
  if (!a) return;
  if (a->rk) rd_kafka_destroy(a->rk);
  lt_bus_conf_destroy(a->conf);
  free(a);
}

/* Waits for the result event of one admin request on q. */
static rd_kafka_event_t *wait_result(rd_kafka_queue_t *q, int timeout_ms) {
  return rd_kafka_queue_poll(q, timeout_ms + 2000);
}

/* Waits until the metadata shows topic with its partitions, for at most timeout_ms. */
static lt_err_t wait_visible(lt_bus_admin_t *a, const char *topic, int timeout_ms, char *errstr,
                             size_t errstr_size) {
  int64_t t0 = lt_time_mono_ms();
  for (;;) {
    int np = 0;
    lt_err_t e = lt_bus_admin_describe_topic(a, topic, timeout_ms, &np, NULL, 0);
    if (e == LT_OK && np > 0) return LT_OK;
    int64_t ms = lt_time_mono_ms() - t0;
    if (ms > timeout_ms)
      return lt_errf(errstr, errstr_size, LT_ERR_TIMEOUT,
                     "topic %s created but not visible in metadata after %d ms", topic,
                     timeout_ms);
    struct timespec nap = {0, 50 * 1000000L};
    nanosleep(&nap, NULL);
  }
}

/* Creates several topics at once; each existing one counts as success. */
static lt_err_t create_topics_once(lt_bus_admin_t *a, rd_kafka_NewTopic_t **nts, size_t n,
                                   int timeout_ms, int *out_created, char *errstr,
                                   size_t errstr_size) {
  rd_kafka_queue_t *q = rd_kafka_queue_new(a->rk);
  rd_kafka_AdminOptions_t *ao = rd_kafka_AdminOptions_new(a->rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
  char rderr[256];
  rd_kafka_AdminOptions_set_operation_timeout(ao, timeout_ms, rderr, sizeof rderr);
  rd_kafka_AdminOptions_set_request_timeout(ao, timeout_ms, rderr, sizeof rderr);
  rd_kafka_CreateTopics(a->rk, nts, n, ao, q);
  rd_kafka_event_t *ev = wait_result(q, timeout_ms);
  lt_err_t ret = LT_OK;
  int created = 0;
  if (!ev) {
    ret = lt_errf(errstr, errstr_size, LT_ERR_TIMEOUT, "create topics: no answer in %d ms",
                  timeout_ms);
  } else if (rd_kafka_event_error(ev)) {
    rd_kafka_resp_err_t e = rd_kafka_event_error(ev);
    ret = lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "create topics: %s",
                  rd_kafka_event_error_string(ev));
  } else {
    size_t cnt;
    const rd_kafka_topic_result_t **tr =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &cnt);
    for (size_t i = 0; i < cnt; i++) {
      rd_kafka_resp_err_t e = rd_kafka_topic_result_error(tr[i]);
      if (e == RD_KAFKA_RESP_ERR_NO_ERROR) created++;
      else if (e != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS && ret == LT_OK)
        ret = lt_errf(errstr, errstr_size,
                      lt_bus_err_from_code(e) == LT_ERR_EXISTS ? LT_ERR_INVALID
                                                               : lt_bus_err_from_code(e),
                      "create topic %s: %s", rd_kafka_topic_result_name(tr[i]),
                      rd_kafka_topic_result_error_string(tr[i])
                          ? rd_kafka_topic_result_error_string(tr[i])
                          : rd_kafka_err2str(e));
    }
  }
  /* The controller answers before every broker's metadata shows the topic; wait until it
   * does, so a caller can use the topic as soon as this returns. */
  if (ret == LT_OK && ev) {
    size_t cnt;
    const rd_kafka_topic_result_t **tr =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &cnt);
    for (size_t i = 0; i < cnt && ret == LT_OK; i++)
      ret = wait_visible(a, rd_kafka_topic_result_name(tr[i]), timeout_ms, errstr, errstr_size);
  }
  if (ev) rd_kafka_event_destroy(ev);
  rd_kafka_AdminOptions_destroy(ao);
  rd_kafka_queue_destroy(q);
  if (out_created) *out_created = created;
  return ret;
}

/* create_topics_once, again while the broker says "not authorized", for at most 30 s (and
 * timeout_ms): ACLs made a moment ago (lt_bus_admin_create_acls) reach KRaft's controller, which
 * authorizes CreateTopics, a little after the broker lists them — over 10 s on a loaded 2-core
 * machine a minute after the broker started. A principal that really lacks the right hears it
 * after that wait. */
static lt_err_t create_topics(lt_bus_admin_t *a, rd_kafka_NewTopic_t **nts, size_t n, int timeout_ms,
                              int *out_created, char *errstr, size_t errstr_size) {
  int64_t t0 = lt_time_mono_ms();
  int total = 0;
  for (;;) {
    int created = 0, left = timeout_ms - (int)(lt_time_mono_ms() - t0);
    lt_err_t e = create_topics_once(a, nts, n, left > 1000 ? left : 1000, &created, errstr, errstr_size);
    total += created;
    int64_t ms = lt_time_mono_ms() - t0;
    if (e != LT_ERR_AUTH || ms > 30000 || ms > timeout_ms) {
      if (out_created) *out_created = total;
      return e;
    }
    struct timespec nap = {0, 200 * 1000000L};
    nanosleep(&nap, NULL);
  }
}

/* Splits a topics file's "key=value" config: the key into key (cut at keyn), the value into *value
 * (in cfg). LT_ERR_INVALID naming where and topic when it is not key=value. */
static lt_err_t split_config(const char *cfg, char *key, size_t keyn, const char **value, const char *where,
                             const char *topic, char *errstr, size_t errstr_size) {
  const char *eq = strchr(cfg, '=');
  if (!eq || eq == cfg)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%stopic %s: config \"%s\" is not key=value", where, topic, cfg);
  snprintf(key, keyn, "%.*s", (int)(eq - cfg), cfg);
  *value = eq + 1;
  return LT_OK;
}

/* A NewTopic with "key=value" configs; NULL with errstr set on a bad config. */
static rd_kafka_NewTopic_t *new_topic(const char *topic, int partitions, int replication,
                                      const char *const *configs, size_t nconfigs,
                                      const char *where, char *errstr, size_t errstr_size) {
  char rderr[256];
  rd_kafka_NewTopic_t *nt =
      rd_kafka_NewTopic_new(topic, partitions, replication, rderr, sizeof rderr);
  if (!nt) {
    lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%stopic %s: %s", where, topic, rderr);
    return NULL;
  }
  for (size_t i = 0; i < nconfigs; i++) {
    char key[128];
    const char *value;
    if (split_config(configs[i], key, sizeof key, &value, where, topic, errstr, errstr_size)) {
      rd_kafka_NewTopic_destroy(nt);
      return NULL;
    }
    rd_kafka_NewTopic_set_config(nt, key, value);
  }
  return nt;
}

lt_err_t lt_bus_admin_create_topic(lt_bus_admin_t *a, const char *topic, int partitions,
                                   int replication, const char *const *configs, size_t nconfigs,
                                   int timeout_ms, char *errstr, size_t errstr_size) {
  rd_kafka_NewTopic_t *nt =
      new_topic(topic, partitions, replication, configs, nconfigs, "", errstr, errstr_size);
  if (!nt) return LT_ERR_INVALID;
  lt_err_t e = create_topics(a, &nt, 1, timeout_ms, NULL, errstr, errstr_size);
  rd_kafka_NewTopic_destroy(nt);
  return e;
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
  return s;
}

lt_err_t lt_bus_topics_file_each(const char *path, const lt_bus_conf_t *conf, lt_bus_topic_fn *fn, void *ctx,
                                 char *errstr, size_t errstr_size) {
  /* NULL: the copy of ops/topics.tsv compiled in (lt_topics_gen.c), so that installed binaries
   * need no source tree. A read-only memory stream keeps one parser for both. */
  FILE *f = path ? fopen(path, "r") : fmemopen((void *)lt_topics_builtin, strlen(lt_topics_builtin), "r");
  if (!path) path = "ops/topics.tsv (built in)";
  if (!f) return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s: %s", path, strerror(errno));
  lt_err_t ret = LT_OK;
  char line[1024];
  int lineno = 0;
  while (ret == LT_OK && fgets(line, sizeof line, f)) {
    lineno++;
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *s = trim(line);
    if (!*s) continue;
    char *fields[3] = {NULL, NULL, NULL};
    int nf = 0;
    for (char *save = NULL, *tok = strtok_r(s, "\t ", &save); tok && nf < 3;
         tok = strtok_r(NULL, "\t ", &save))
      fields[nf++] = tok;
    char where[64];
    snprintf(where, sizeof where, "%s:%d: ", path, lineno);
    if (nf < 2) {
      ret = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                    "%sexpected \"name<TAB>partitions<TAB>configs\"", where);
      break;
    }
    char *end;
    long parts = strtol(fields[1], &end, 10);
    if (*end || parts < 1 || parts > 10000) {
      ret = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                    "%spartitions \"%s\" is not a number in 1..10000", where, fields[1]);
      break;
    }
    const char *cfgs[32];
    size_t ncfg = 0;
    if (fields[2] && strcmp(fields[2], "-") != 0) {
      for (char *save = NULL, *tok = strtok_r(fields[2], ",", &save); tok;
           tok = strtok_r(NULL, ",", &save)) {
        if (ncfg == 32) {
          ret = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%smore than 32 configs", where);
          break;
        }
        cfgs[ncfg++] = tok;
      }
      if (ret) break;
    }
    char full[256];
    if (lt_bus_topic_name(conf, fields[0], full, sizeof full) >= sizeof full) {
      ret = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%stopic name too long", where);
      break;
    }
    ret = fn(ctx, full, (int)parts, cfgs, ncfg, where, errstr, errstr_size);
  }
  fclose(f);
  return ret;
}

typedef struct {
  int replication;
  rd_kafka_NewTopic_t **nts;
  size_t n, cap;
} new_topics_t;

static lt_err_t collect_new_topic(void *ctx, const char *topic, int partitions, const char *const *configs,
                                  size_t nconfigs, const char *where, char *errstr, size_t errstr_size) {
  new_topics_t *c = ctx;
  rd_kafka_NewTopic_t *nt = new_topic(topic, partitions, c->replication, configs, nconfigs, where, errstr, errstr_size);
  if (!nt) return LT_ERR_INVALID;
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 16;
    rd_kafka_NewTopic_t **nn = realloc(c->nts, cap * sizeof *nn);
    if (!nn) {
      rd_kafka_NewTopic_destroy(nt);
      return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
    }
    c->nts = nn;
    c->cap = cap;
  }
  c->nts[c->n++] = nt;
  return LT_OK;
}

lt_err_t lt_bus_admin_create_from_file(lt_bus_admin_t *a, const char *path, int replication,
                                       int timeout_ms, int *out_created, char *errstr,
                                       size_t errstr_size) {
  new_topics_t c = {.replication = replication};
  lt_err_t ret = lt_bus_topics_file_each(path, a->conf, collect_new_topic, &c, errstr, errstr_size);
  if (ret == LT_OK && c.n > 0)
    ret = create_topics(a, c.nts, c.n, timeout_ms, out_created, errstr, errstr_size);
  else if (out_created)
    *out_created = 0;
  for (size_t i = 0; i < c.n; i++) rd_kafka_NewTopic_destroy(c.nts[i]);
  free(c.nts);
  return ret;
}

/* ---------------------------------------------------------------- configs of existing topics */

typedef struct {
  char *topic;
  char **key, **value; /* the file's configs of the topic */
  size_t nkv;
} want_t;

typedef struct {
  want_t *w;
  size_t n, cap;
} wants_t;

static void wants_free(wants_t *ws) {
  for (size_t i = 0; i < ws->n; i++) {
    for (size_t k = 0; k < ws->w[i].nkv; k++) free(ws->w[i].key[k]), free(ws->w[i].value[k]);
    free(ws->w[i].key);
    free(ws->w[i].value);
    free(ws->w[i].topic);
  }
  free(ws->w);
}

static lt_err_t collect_want(void *ctx, const char *topic, int partitions, const char *const *configs, size_t nconfigs,
                             const char *where, char *errstr, size_t errstr_size) {
  wants_t *ws = ctx;
  if (ws->n == ws->cap) {
    size_t cap = ws->cap ? ws->cap * 2 : 16;
    want_t *nw = realloc(ws->w, cap * sizeof *nw);
    if (!nw) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
    ws->w = nw;
    ws->cap = cap;
  }
  want_t *w = &ws->w[ws->n++];
  *w = (want_t){.topic = strdup(topic),
                .key = calloc(nconfigs ? nconfigs : 1, sizeof *w->key),
                .value = calloc(nconfigs ? nconfigs : 1, sizeof *w->value)};
  if (!w->topic || !w->key || !w->value) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < nconfigs; i++) {
    char key[128];
    const char *value;
    lt_err_t e = split_config(configs[i], key, sizeof key, &value, where, topic, errstr, errstr_size);
    if (e) return e;
    size_t k = w->nkv++; /* counted first: wants_free frees what was made */
    w->key[k] = strdup(key);
    w->value[k] = strdup(value);
    if (!w->key[k] || !w->value[k]) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  }
  return LT_OK;
}

/* DescribeConfigs or AlterConfigs (alter) over resources: its result event into *out. */
static lt_err_t configs_request(lt_bus_admin_t *a, bool alter, rd_kafka_ConfigResource_t **res, size_t n,
                                int timeout_ms, rd_kafka_event_t **out, char *errstr, size_t errstr_size) {
  rd_kafka_queue_t *q = rd_kafka_queue_new(a->rk);
  rd_kafka_AdminOptions_t *ao =
      rd_kafka_AdminOptions_new(a->rk, alter ? RD_KAFKA_ADMIN_OP_ALTERCONFIGS : RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS);
  char rderr[256];
  rd_kafka_AdminOptions_set_request_timeout(ao, timeout_ms, rderr, sizeof rderr);
  if (alter) rd_kafka_AlterConfigs(a->rk, res, n, ao, q);
  else rd_kafka_DescribeConfigs(a->rk, res, n, ao, q);
  rd_kafka_event_t *ev = wait_result(q, timeout_ms);
  rd_kafka_AdminOptions_destroy(ao);
  rd_kafka_queue_destroy(q);
  const char *what = alter ? "alter topic configs" : "describe topic configs";
  *out = NULL;
  if (!ev) return lt_errf(errstr, errstr_size, LT_ERR_TIMEOUT, "%s: no answer in %d ms", what, timeout_ms);
  rd_kafka_resp_err_t e = rd_kafka_event_error(ev);
  if (e) {
    lt_err_t ret = lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "%s: %s", what, rd_kafka_event_error_string(ev));
    rd_kafka_event_destroy(ev);
    return ret;
  }
  *out = ev;
  return LT_OK;
}

static const rd_kafka_ConfigEntry_t *entry_named(const rd_kafka_ConfigEntry_t **ents, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(rd_kafka_ConfigEntry_name(ents[i]), name) == 0) return ents[i];
  return NULL;
}

/* Does the file name config `name` for w's topic? */
static bool want_names(const want_t *w, const char *name) {
  for (size_t k = 0; k < w->nkv; k++)
    if (strcmp(w->key[k], name) == 0) return true;
  return false;
}

/* Appends "; " and text to out (cut at its end). */
static void say(char *out, size_t n, const char *text) {
  size_t used = strlen(out);
  if (used + 1 < n) snprintf(out + used, n - used, "%s%s", used ? "; " : "", text);
}

lt_err_t lt_bus_admin_reconcile_from_file(lt_bus_admin_t *a, const char *path, int timeout_ms, int *out_altered,
                                          char *changes, size_t changes_size, char *errstr, size_t errstr_size) {
  if (out_altered) *out_altered = 0;
  if (changes && changes_size) changes[0] = '\0';
  wants_t ws = {0};
  lt_err_t ret = lt_bus_topics_file_each(path, a->conf, collect_want, &ws, errstr, errstr_size);
  rd_kafka_ConfigResource_t **res = ret ? NULL : calloc(ws.n ? ws.n : 1, sizeof *res);
  rd_kafka_ConfigResource_t **alt = ret ? NULL : calloc(ws.n ? ws.n : 1, sizeof *alt);
  size_t nalt = 0;
  rd_kafka_event_t *ev = NULL;
  if (!ret && (!res || !alt)) ret = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; !ret && i < ws.n; i++) res[i] = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, ws.w[i].topic);
  if (!ret && ws.n) ret = configs_request(a, false, res, ws.n, timeout_ms, &ev, errstr, errstr_size);
  size_t nr = 0;
  const rd_kafka_ConfigResource_t **got =
      ev ? rd_kafka_DescribeConfigs_result_resources(rd_kafka_event_DescribeConfigs_result(ev), &nr) : NULL;
  for (size_t r = 0; !ret && r < nr; r++) {
    const char *topic = rd_kafka_ConfigResource_name(got[r]);
    rd_kafka_resp_err_t re = rd_kafka_ConfigResource_error(got[r]);
    if (re == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) continue; /* not made yet: its creation sets them */
    if (re) {
      ret = lt_errf(errstr, errstr_size, lt_bus_err_from_code(re), "topic %s: configs: %s", topic,
                    rd_kafka_ConfigResource_error_string(got[r]) ? rd_kafka_ConfigResource_error_string(got[r])
                                                                 : rd_kafka_err2str(re));
      break;
    }
    const want_t *w = NULL;
    for (size_t i = 0; i < ws.n && !w; i++)
      if (strcmp(ws.w[i].topic, topic) == 0) w = &ws.w[i];
    if (!w) continue;
    size_t ne = 0;
    const rd_kafka_ConfigEntry_t **ents = rd_kafka_ConfigResource_configs(got[r], &ne);
    bool differs = false;
    for (size_t k = 0; k < w->nkv; k++) {
      const rd_kafka_ConfigEntry_t *e = entry_named(ents, ne, w->key[k]);
      const char *now = e ? rd_kafka_ConfigEntry_value(e) : NULL;
      if (now && strcmp(now, w->value[k]) == 0) continue;
      differs = true;
      char line[512];
      snprintf(line, sizeof line, "%s %s %s -> %s", topic, w->key[k], now ? now : "(unset)", w->value[k]);
      if (changes) say(changes, changes_size, line);
    }
    if (!differs) continue;
    /* AlterConfigs replaces the topic's whole set of its own configs: carry over the ones set on
     * it that the file does not name (an operator's min.insync.replicas, say). */
    rd_kafka_ConfigResource_t *c = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic);
    alt[nalt++] = c;
    for (size_t i = 0; !ret && i < ne; i++) {
      if (rd_kafka_ConfigEntry_source(ents[i]) != RD_KAFKA_CONFIG_SOURCE_DYNAMIC_TOPIC_CONFIG) continue;
      const char *name = rd_kafka_ConfigEntry_name(ents[i]);
      if (want_names(w, name)) continue;
      if (!rd_kafka_ConfigEntry_value(ents[i]))
        ret = lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                      "topic %s: this principal cannot read its config %s, which altering the others would drop: "
                      "set the file's configs with Kafka's kafka-configs.sh",
                      topic, name);
      else
        rd_kafka_ConfigResource_set_config(c, name, rd_kafka_ConfigEntry_value(ents[i]));
    }
    for (size_t k = 0; !ret && k < w->nkv; k++) rd_kafka_ConfigResource_set_config(c, w->key[k], w->value[k]);
  }
  if (ev) rd_kafka_event_destroy(ev);
  if (!ret && nalt) {
    rd_kafka_event_t *aev = NULL;
    ret = configs_request(a, true, alt, nalt, timeout_ms, &aev, errstr, errstr_size);
    size_t na = 0;
    const rd_kafka_ConfigResource_t **done =
        aev ? rd_kafka_AlterConfigs_result_resources(rd_kafka_event_AlterConfigs_result(aev), &na) : NULL;
    for (size_t r = 0; !ret && r < na; r++) {
      rd_kafka_resp_err_t re = rd_kafka_ConfigResource_error(done[r]);
      if (re)
        ret = lt_errf(errstr, errstr_size, lt_bus_err_from_code(re),
                      "topic %s: altering its configs: %s", rd_kafka_ConfigResource_name(done[r]),
                      rd_kafka_ConfigResource_error_string(done[r]) ? rd_kafka_ConfigResource_error_string(done[r])
                                                                    : rd_kafka_err2str(re));
    }
    if (aev) rd_kafka_event_destroy(aev);
    if (!ret && out_altered) *out_altered = (int)nalt;
  }
  for (size_t i = 0; res && i < ws.n; i++)
    if (res[i]) rd_kafka_ConfigResource_destroy(res[i]);
  for (size_t i = 0; i < nalt; i++) rd_kafka_ConfigResource_destroy(alt[i]);
  free(res);
  free(alt);
  wants_free(&ws);
  return ret;
}

lt_err_t lt_bus_admin_describe_topic(lt_bus_admin_t *a, const char *topic, int timeout_ms,
                                     int *out_partitions, char *errstr, size_t errstr_size) {
  const struct rd_kafka_metadata *md = NULL;
  lt_err_t ret = lt_bus_topic_metadata(a->rk, topic, timeout_ms, &md, errstr, errstr_size);
  if (ret) return ret;
  if (md->topic_cnt != 1 || md->topics[0].err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
      md->topics[0].partition_cnt == 0)
    ret = lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND, "topic %s does not exist", topic);
  else if (md->topics[0].err)
    ret = lt_errf(errstr, errstr_size, lt_bus_err_from_code(md->topics[0].err), "topic %s: %s",
                  topic, rd_kafka_err2str(md->topics[0].err));
  else if (out_partitions)
    *out_partitions = md->topics[0].partition_cnt;
  rd_kafka_metadata_destroy(md);
  return ret;
}

static int cmp_str(const void *x, const void *y) {
  return strcmp(*(char *const *)x, *(char *const *)y);
}

lt_err_t lt_bus_admin_list_topics(lt_bus_admin_t *a, int timeout_ms, char ***out_names,
                                  size_t *out_n, char *errstr, size_t errstr_size) {
  const struct rd_kafka_metadata *md = NULL;
  rd_kafka_resp_err_t e = rd_kafka_metadata(a->rk, 1, NULL, &md, timeout_ms);
  if (e)
    return lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "list topics: %s",
                   rd_kafka_err2str(e));
  char **names = calloc((size_t)md->topic_cnt + 1, sizeof *names);
  size_t n = 0;
  for (int i = 0; names && i < md->topic_cnt; i++) {
    if (strncmp(md->topics[i].topic, "__", 2) == 0 || md->topics[i].err) continue;
    if (!(names[n] = strdup(md->topics[i].topic))) {
      lt_bus_admin_free_names(names);
      names = NULL;
      break;
    }
    n++;
  }
  rd_kafka_metadata_destroy(md);
  if (!names) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  qsort(names, n, sizeof *names, cmp_str);
  *out_names = names;
  *out_n = n;
  return LT_OK;
}

void lt_bus_admin_free_names(char **names) {
  if (!names) return;
  for (char **p = names; *p; p++) free(*p);
  free(names);
}

lt_err_t lt_bus_admin_delete_topics(lt_bus_admin_t *a, const char *const *topics, size_t n,
                                    int timeout_ms, char *errstr, size_t errstr_size) {
  if (n == 0) return LT_OK;
  rd_kafka_DeleteTopic_t **dts = calloc(n, sizeof *dts);
  if (!dts) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) dts[i] = rd_kafka_DeleteTopic_new(topics[i]);
  rd_kafka_queue_t *q = rd_kafka_queue_new(a->rk);
  rd_kafka_AdminOptions_t *ao = rd_kafka_AdminOptions_new(a->rk, RD_KAFKA_ADMIN_OP_DELETETOPICS);
  char rderr[256];
  rd_kafka_AdminOptions_set_operation_timeout(ao, timeout_ms, rderr, sizeof rderr);
  rd_kafka_DeleteTopics(a->rk, dts, n, ao, q);
  rd_kafka_event_t *ev = wait_result(q, timeout_ms);
  lt_err_t ret = LT_OK;
  if (!ev) {
    ret = lt_errf(errstr, errstr_size, LT_ERR_TIMEOUT, "delete topics: no answer in %d ms",
                  timeout_ms);
  } else if (rd_kafka_event_error(ev)) {
    ret = lt_errf(errstr, errstr_size, lt_bus_err_from_code(rd_kafka_event_error(ev)),
                  "delete topics: %s", rd_kafka_event_error_string(ev));
  } else {
    size_t cnt;
    const rd_kafka_topic_result_t **tr =
        rd_kafka_DeleteTopics_result_topics(rd_kafka_event_DeleteTopics_result(ev), &cnt);
    for (size_t i = 0; i < cnt && ret == LT_OK; i++) {
      rd_kafka_resp_err_t e = rd_kafka_topic_result_error(tr[i]);
      if (e && e != RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
        ret = lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "delete topic %s: %s",
                      rd_kafka_topic_result_name(tr[i]), rd_kafka_err2str(e));
    }
  }
  if (ev) rd_kafka_event_destroy(ev);
  rd_kafka_AdminOptions_destroy(ao);
  rd_kafka_queue_destroy(q);
  rd_kafka_DeleteTopic_destroy_array(dts, n);
  free(dts);
  return ret;
}
