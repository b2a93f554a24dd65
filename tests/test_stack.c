/* Integration test of the local stack (ops/stack): the Kafka broker has every topic of
 * ops/topics.tsv with its partition count and configs, takes transactions that a
 * read_committed consumer sees (and hides aborted ones), and the S3 server takes put, get,
 * head, list and delete from Debian's libs3 in the bucket. It talks to librdkafka and libs3
 * directly, so a failure here points at the stack, not at Lathe's own bus or store code.
 *
 * Needs `ops/stack up` and `eval "$(ops/stack env)"`; fails (never skips) when a server or a
 * variable is missing. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <libs3.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STACK_HINT "run `ops/stack up` and `eval \"$(ops/stack env)\"` first"

/* ------------------------------------------------------------------ environment */

static const char *need_env(const char *name)
{
    const char *v = getenv(name);
    if (v == NULL || v[0] == '\0')
        cr_assert_fail("environment variable %s is not set: %s", name, STACK_HINT);
    return v;
}

/* ------------------------------------------------------------------ ops/topics.tsv */

#define MAX_TOPICS 64
#define MAX_CONFIGS 8

struct topic_row {
    char name[256]; /* with prefix */
    int partitions;
    int nconfigs;
    char key[MAX_CONFIGS][64];
    char value[MAX_CONFIGS][64];
};

/* Reads ops/topics.tsv as documented at its top; returns the number of rows. */
static int read_topics(struct topic_row *rows, int max)
{
    const char *root = need_env("LATHE_SOURCE_ROOT");
    const char *prefix = getenv("LATHE_TOPIC_PREFIX");
    if (prefix == NULL)
        prefix = "lathe.";
    char path[4096];
    snprintf(path, sizeof path, "%s/ops/topics.tsv", root);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot open %s: %s", path, strerror(errno));

    char line[1024];
    int n = 0, lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#')
            continue;
        cr_assert_lt(n, max, "%s: more than %d topics", path, max);
        struct topic_row *r = &rows[n];
        memset(r, 0, sizeof *r);
        char *save = NULL;
        char *name = strtok_r(line, "\t", &save);
        char *parts = strtok_r(NULL, "\t", &save);
        char *configs = strtok_r(NULL, "\t", &save);
        cr_assert(name && parts && configs, "%s:%d: want 3 TAB-separated columns", path, lineno);
        snprintf(r->name, sizeof r->name, "%s%s", prefix, name);
        r->partitions = atoi(parts);
        cr_assert_gt(r->partitions, 0, "%s:%d: partitions '%s' is not positive", path, lineno,
                     parts);
        if (strcmp(configs, "-") != 0) {
            char *save2 = NULL;
            for (char *kv = strtok_r(configs, ",", &save2); kv; kv = strtok_r(NULL, ",", &save2)) {
                char *eq = strchr(kv, '=');
                cr_assert(eq != NULL, "%s:%d: config '%s' is not key=value", path, lineno, kv);
                cr_assert_lt(r->nconfigs, MAX_CONFIGS, "%s:%d: too many configs", path, lineno);
                *eq = '\0';
                snprintf(r->key[r->nconfigs], 64, "%s", kv);
                snprintf(r->value[r->nconfigs], 64, "%s", eq + 1);
                r->nconfigs++;
            }
        }
        n++;
    }
    fclose(f);
    cr_assert_gt(n, 0, "%s lists no topics", path);
    return n;
}

/* ------------------------------------------------------------------ Kafka */

/* The admin principal's properties (LATHE_KAFKA_CONFIG_DIR/admin.properties, from `ops/stack
 * env`): the broker takes no anonymous client (docs/DESIGN.md §5a). */
static void set_credentials(rd_kafka_conf_t *conf)
{
    const char *dir = getenv("LATHE_KAFKA_CONFIG_DIR");
    if (dir == NULL || !*dir)
        return;
    char path[4096], line[1024], errstr[512];
    snprintf(path, sizeof path, "%s/admin.properties", dir);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot open %s: %s", path, strerror(errno));
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        char *eq = strchr(line, '=');
        if (line[0] == '#' || eq == NULL)
            continue;
        *eq = '\0';
        cr_assert_eq(rd_kafka_conf_set(conf, line, eq + 1, errstr, sizeof errstr), RD_KAFKA_CONF_OK,
                     "%s: %s", path, errstr);
    }
    fclose(f);
}

static rd_kafka_t *new_client(rd_kafka_type_t type, rd_kafka_conf_t *conf)
{
    char errstr[512];
    if (conf == NULL)
        conf = rd_kafka_conf_new();
    set_credentials(conf);
    cr_assert_eq(rd_kafka_conf_set(conf, "bootstrap.servers", need_env("LATHE_KAFKA_BOOTSTRAP"),
                                   errstr, sizeof errstr),
                 RD_KAFKA_CONF_OK, "%s", errstr);
    rd_kafka_conf_set(conf, "socket.timeout.ms", "10000", NULL, 0);
    rd_kafka_t *rk = rd_kafka_new(type, conf, errstr, sizeof errstr);
    cr_assert_not_null(rk, "rd_kafka_new: %s", errstr);
    return rk;
}

Test(stack, every_topic_of_topics_tsv_exists_with_its_partition_count)
{
    static struct topic_row rows[MAX_TOPICS];
    int n = read_topics(rows, MAX_TOPICS);
    rd_kafka_t *rk = new_client(RD_KAFKA_PRODUCER, NULL);

    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 1, NULL, &md, 15000);
    cr_assert_eq(err, RD_KAFKA_RESP_ERR_NO_ERROR, "no metadata from Kafka at %s: %s; %s",
                 need_env("LATHE_KAFKA_BOOTSTRAP"), rd_kafka_err2str(err), STACK_HINT);

    for (int i = 0; i < n; i++) {
        const struct rd_kafka_metadata_topic *t = NULL;
        for (int j = 0; j < md->topic_cnt; j++)
            if (strcmp(md->topics[j].topic, rows[i].name) == 0)
                t = &md->topics[j];
        cr_assert_not_null(t, "topic %s of ops/topics.tsv is missing on the broker", rows[i].name);
        cr_assert_eq(t->err, RD_KAFKA_RESP_ERR_NO_ERROR, "topic %s: %s", rows[i].name,
                     rd_kafka_err2str(t->err));
        cr_expect_eq(t->partition_cnt, rows[i].partitions,
                     "topic %s has %d partitions, ops/topics.tsv says %d", rows[i].name,
                     t->partition_cnt, rows[i].partitions);
        for (int p = 0; p < t->partition_cnt; p++)
            cr_expect_geq(t->partitions[p].leader, 0, "topic %s partition %d has no leader",
                          rows[i].name, p);
    }
    rd_kafka_metadata_destroy(md);
    rd_kafka_destroy(rk);
}

Test(stack, every_topic_carries_the_configs_of_topics_tsv)
{
    static struct topic_row rows[MAX_TOPICS];
    int n = read_topics(rows, MAX_TOPICS);
    rd_kafka_t *rk = new_client(RD_KAFKA_PRODUCER, NULL);
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);

    rd_kafka_ConfigResource_t *res[MAX_TOPICS];
    for (int i = 0; i < n; i++)
        res[i] = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, rows[i].name);
    rd_kafka_DescribeConfigs(rk, res, (size_t)n, NULL, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000);
    cr_assert_not_null(ev, "DescribeConfigs got no answer in 30 s; %s", STACK_HINT);
    cr_assert_eq(rd_kafka_event_error(ev), RD_KAFKA_RESP_ERR_NO_ERROR, "DescribeConfigs: %s",
                 rd_kafka_event_error_string(ev));
    const rd_kafka_DescribeConfigs_result_t *result = rd_kafka_event_DescribeConfigs_result(ev);
    cr_assert_not_null(result);
    size_t cnt = 0;
    const rd_kafka_ConfigResource_t **got = rd_kafka_DescribeConfigs_result_resources(result, &cnt);

    for (int i = 0; i < n; i++) {
        const rd_kafka_ConfigResource_t *r = NULL;
        for (size_t j = 0; j < cnt; j++)
            if (strcmp(rd_kafka_ConfigResource_name(got[j]), rows[i].name) == 0)
                r = got[j];
        cr_assert_not_null(r, "no configs described for %s", rows[i].name);
        cr_assert_eq(rd_kafka_ConfigResource_error(r), RD_KAFKA_RESP_ERR_NO_ERROR, "%s: %s",
                     rows[i].name, rd_kafka_ConfigResource_error_string(r));
        size_t ncfg = 0;
        const rd_kafka_ConfigEntry_t **entries = rd_kafka_ConfigResource_configs(r, &ncfg);
        for (int k = 0; k < rows[i].nconfigs; k++) {
            const char *have = NULL;
            for (size_t e = 0; e < ncfg; e++)
                if (strcmp(rd_kafka_ConfigEntry_name(entries[e]), rows[i].key[k]) == 0)
                    have = rd_kafka_ConfigEntry_value(entries[e]);
            cr_expect(have != NULL && strcmp(have, rows[i].value[k]) == 0,
                      "topic %s: %s is '%s', ops/topics.tsv says '%s'", rows[i].name,
                      rows[i].key[k], have ? have : "(absent)", rows[i].value[k]);
        }
    }
    rd_kafka_event_destroy(ev);
    for (int i = 0; i < n; i++)
        rd_kafka_ConfigResource_destroy(res[i]);
    rd_kafka_queue_destroy(q);
    rd_kafka_destroy(rk);
}

/* Creates a scratch topic (auto-creation is off on the stack's broker). */
static void create_scratch_topic(rd_kafka_t *rk, const char *name)
{
    char errstr[512];
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(name, 1, 1, errstr, sizeof errstr);
    cr_assert_not_null(nt, "%s", errstr);
    rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000);
    cr_assert_not_null(ev, "CreateTopics %s: no answer in 30 s", name);
    size_t cnt = 0;
    const rd_kafka_topic_result_t **tr =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &cnt);
    cr_assert_eq(cnt, 1);
    cr_assert_eq(rd_kafka_topic_result_error(tr[0]), RD_KAFKA_RESP_ERR_NO_ERROR,
                 "CreateTopics %s: %s", name, rd_kafka_topic_result_error_string(tr[0]));
    rd_kafka_event_destroy(ev);
    rd_kafka_NewTopic_destroy(nt);
    rd_kafka_queue_destroy(q);
}

static void delete_scratch_topic(rd_kafka_t *rk, const char *name)
{
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_DeleteTopic_t *dt = rd_kafka_DeleteTopic_new(name);
    rd_kafka_DeleteTopics(rk, &dt, 1, NULL, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000);
    if (ev)
        rd_kafka_event_destroy(ev);
    rd_kafka_DeleteTopic_destroy(dt);
    rd_kafka_queue_destroy(q);
}

static void txn_ok(rd_kafka_error_t *e, const char *what)
{
    if (e == NULL)
        return;
    cr_assert_fail("%s: %s (the broker's transaction state log needs RF 1 and min ISR 1 on one node)",
             what, rd_kafka_error_string(e));
}

Test(stack, broker_commits_and_aborts_transactions_for_read_committed_consumers)
{
    char topic[128], txid[128], errstr[512];
    /* Under the prefix the admin principal may use (ops/acls.tsv). */
    snprintf(topic, sizeof topic, "lathe.stack-test.txn.%ld.%d", (long)time(NULL), (int)getpid());
    snprintf(txid, sizeof txid, "lathe.stack-test-%d", (int)getpid());

    rd_kafka_conf_t *pc = rd_kafka_conf_new();
    cr_assert_eq(rd_kafka_conf_set(pc, "transactional.id", txid, errstr, sizeof errstr),
                 RD_KAFKA_CONF_OK, "%s", errstr);
    rd_kafka_t *p = new_client(RD_KAFKA_PRODUCER, pc);
    create_scratch_topic(p, topic);

    txn_ok(rd_kafka_init_transactions(p, 30000), "init_transactions");
    const char *committed[] = {"c1", "c2"};
    /* Transaction 1 is aborted, transaction 2 committed: only c1, c2 may be read. */
    txn_ok(rd_kafka_begin_transaction(p), "begin_transaction");
    cr_assert_eq(rd_kafka_producev(p, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_VALUE("aborted", 7),
                                   RD_KAFKA_V_END),
                 RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_flush(p, 10000);
    txn_ok(rd_kafka_abort_transaction(p, 30000), "abort_transaction");
    txn_ok(rd_kafka_begin_transaction(p), "begin_transaction");
    for (int i = 0; i < 2; i++)
        cr_assert_eq(rd_kafka_producev(p, RD_KAFKA_V_TOPIC(topic),
                                       RD_KAFKA_V_VALUE((void *)committed[i], 2), RD_KAFKA_V_END),
                     RD_KAFKA_RESP_ERR_NO_ERROR);
    txn_ok(rd_kafka_commit_transaction(p, 30000), "commit_transaction");

    rd_kafka_conf_t *cc = rd_kafka_conf_new();
    char group[160];
    snprintf(group, sizeof group, "%s.group", topic);
    rd_kafka_conf_set(cc, "group.id", group, NULL, 0);
    rd_kafka_conf_set(cc, "isolation.level", "read_committed", NULL, 0);
    rd_kafka_conf_set(cc, "auto.offset.reset", "earliest", NULL, 0);
    rd_kafka_conf_set(cc, "enable.auto.commit", "false", NULL, 0);
    rd_kafka_t *c = new_client(RD_KAFKA_CONSUMER, cc);
    rd_kafka_poll_set_consumer(c);
    rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(sub, topic, RD_KAFKA_PARTITION_UA);
    cr_assert_eq(rd_kafka_subscribe(c, sub), RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_topic_partition_list_destroy(sub);

    int got = 0;
    time_t deadline = time(NULL) + 30;
    while (got < 2 && time(NULL) < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 500);
        if (m == NULL)
            continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            rd_kafka_message_destroy(m);
            continue;
        }
        cr_assert_eq(m->err, RD_KAFKA_RESP_ERR_NO_ERROR, "consume: %s", rd_kafka_message_errstr(m));
        cr_assert_eq(m->len, 2, "read a record of %zu bytes: the aborted one leaked through",
                     m->len);
        cr_assert_eq(memcmp(m->payload, committed[got], 2), 0, "record %d is not %s", got,
                     committed[got]);
        got++;
        rd_kafka_message_destroy(m);
    }
    cr_assert_eq(got, 2, "read %d of 2 committed records in 30 s (consumer group %s)", got, group);

    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    delete_scratch_topic(p, topic);
    rd_kafka_destroy(p);
}

/* ------------------------------------------------------------------ S3 through libs3 */

struct s3_call {
    S3Status status;
    char error[512];
    uint64_t content_length;
    /* put source / get sink */
    const char *put_data;
    size_t put_len, put_off;
    char *get_buf;
    size_t get_cap, get_len;
    /* list */
    const char *want_key;
    int found;
    uint64_t found_size;
};

static S3Status on_properties(const S3ResponseProperties *p, void *cb)
{
    struct s3_call *c = cb;
    c->content_length = p->contentLength;
    return S3StatusOK;
}

static void on_complete(S3Status status, const S3ErrorDetails *e, void *cb)
{
    struct s3_call *c = cb;
    c->status = status;
    snprintf(c->error, sizeof c->error, "%s%s%s", S3_get_status_name(status),
             e && e->message ? ": " : "", e && e->message ? e->message : "");
}

static int on_put_data(int size, char *buf, void *cb)
{
    struct s3_call *c = cb;
    size_t n = c->put_len - c->put_off;
    if (n > (size_t)size)
        n = (size_t)size;
    memcpy(buf, c->put_data + c->put_off, n);
    c->put_off += n;
    return (int)n;
}

static S3Status on_get_data(int size, const char *buf, void *cb)
{
    struct s3_call *c = cb;
    if (c->get_len + (size_t)size > c->get_cap)
        return S3StatusAbortedByCallback;
    memcpy(c->get_buf + c->get_len, buf, (size_t)size);
    c->get_len += (size_t)size;
    return S3StatusOK;
}

static S3Status on_list(int truncated, const char *next, int n, const S3ListBucketContent *contents,
                        int nprefixes, const char **prefixes, void *cb)
{
    struct s3_call *c = cb;
    for (int i = 0; i < n; i++)
        if (strcmp(contents[i].key, c->want_key) == 0) {
            c->found = 1;
            c->found_size = contents[i].size;
        }
    return S3StatusOK;
}

static const S3ResponseHandler response_handler = {on_properties, on_complete};

/* libs3 retries nothing itself; a fresh local server answers at once, so one try each. */
#define S3_CHECK(call, what)                                                                       \
    cr_assert_eq((call).status, S3StatusOK, "%s against %s: %s; %s", what,                         \
                 need_env("LATHE_S3_ENDPOINT"), (call).error, STACK_HINT)

Test(stack, bucket_takes_put_get_head_list_delete_from_libs3)
{
    S3BucketContext bucket = {
        .hostName = need_env("LATHE_S3_ENDPOINT"),
        .bucketName = need_env("LATHE_S3_BUCKET"),
        .protocol = S3ProtocolHTTP,
        .uriStyle = S3UriStylePath,
        .accessKeyId = need_env("LATHE_S3_ACCESS_KEY"),
        .secretAccessKey = need_env("LATHE_S3_SECRET_KEY"),
    };
    cr_assert_eq(S3_initialize("lathe-test-stack", S3_INIT_ALL, bucket.hostName), S3StatusOK);

    /* Bytes 0..255 repeated, with a prime length so no buffer boundary lines up. */
    enum { LEN = 70001 };
    static char data[LEN], back[LEN + 16];
    for (size_t i = 0; i < LEN; i++)
        data[i] = (char)(i * 7 + 3);
    char prefix[128], key[192];
    snprintf(prefix, sizeof prefix, "stack-test/%ld-%d/", (long)time(NULL), (int)getpid());
    snprintf(key, sizeof key, "%sobject.bin", prefix);

    struct s3_call put = {.put_data = data, .put_len = LEN};
    S3PutObjectHandler ph = {response_handler, on_put_data};
    S3_put_object(&bucket, key, LEN, NULL, NULL, &ph, &put);
    S3_CHECK(put, "PUT");
    cr_assert_eq(put.put_off, LEN, "libs3 sent %zu of %d bytes", put.put_off, LEN);

    struct s3_call get = {.get_buf = back, .get_cap = sizeof back};
    S3GetObjectHandler gh = {response_handler, on_get_data};
    S3_get_object(&bucket, key, NULL, 0, 0, NULL, &gh, &get);
    S3_CHECK(get, "GET");
    cr_assert_eq(get.get_len, LEN, "GET returned %zu bytes, PUT sent %d", get.get_len, LEN);
    cr_assert_eq(memcmp(back, data, LEN), 0, "GET returned different bytes than PUT sent");

    struct s3_call head = {0};
    S3_head_object(&bucket, key, NULL, &response_handler, &head);
    S3_CHECK(head, "HEAD");
    cr_assert_eq(head.content_length, LEN, "HEAD says %" PRIu64 " bytes, want %d",
                 head.content_length, LEN);

    struct s3_call list = {.want_key = key};
    S3ListBucketHandler lh = {response_handler, on_list};
    S3_list_bucket(&bucket, prefix, NULL, NULL, 100, NULL, &lh, &list);
    S3_CHECK(list, "LIST");
    cr_assert(list.found, "LIST under %s did not return %s", prefix, key);
    cr_assert_eq(list.found_size, LEN, "LIST says %" PRIu64 " bytes, want %d", list.found_size,
                 LEN);

    struct s3_call del = {0};
    S3_delete_object(&bucket, key, NULL, &response_handler, &del);
    S3_CHECK(del, "DELETE");

    struct s3_call gone = {0};
    S3_head_object(&bucket, key, NULL, &response_handler, &gone);
    cr_assert_eq(gone.status, S3StatusHttpErrorNotFound, "HEAD after DELETE: %s, want not found",
                 gone.error);

    struct s3_call relist = {.want_key = key};
    S3_list_bucket(&bucket, prefix, NULL, NULL, 100, NULL, &lh, &relist);
    S3_CHECK(relist, "LIST after DELETE");
    cr_assert(!relist.found, "LIST still returns %s after DELETE", key);

    S3_deinitialize();
}
