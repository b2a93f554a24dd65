#!/usr/bin/python3
"""Upstream producers: JobSubmitted records written straight into lathe.jobs by another Kafka
client are validated exactly like API submissions (docs/DESIGN.md §1, §3, §9).

Run by Debian's /usr/bin/python3 with python3-confluent-kafka and python3-avro, against the real
broker (and, for the API half, the object store of `ops/stack env`):

  1. A fresh topic prefix; `lathe admin topics`; a tenant with max_job_duration_s = 3600.
  2. `lathed --role scheduler` (child, LATHE_INSTANCE=sched-up) until it prints "leading", and
     `lathed --role api --port 0` (child) for a dataset of the tenant and the API's answers.
  3. confluent_kafka (acks=all, idempotent) produces into <prefix>jobs, partitions by class
     (0-1 production, 2-3 standard, 4-5 preemptible), key job_id, values in Avro single-object
     encoding written here (C3 01, CRC-64-AVRO fingerprint of the Parsing Canonical Form computed
     from the specification, python3-avro binary body):
       a  a valid JobSubmitted (production)                   -> JobAccepted
       b  hyperparameters.learning_rate = 5                   -> JobRejected, that field
       c  an unknown tenant                                   -> JobRejected, tenant_id
       d  max_duration_s 7200 over the tenant's 3600           -> JobRejected, max_duration_s
       e1 raw garbage bytes (no single-object header)         -> one DeadLetter
       e2 C3 01 + JobSubmitted's fingerprint + a cut body      -> one DeadLetter
       f  after the garbage, on its partition: a valid one     -> JobAccepted (the consumer went on)
       g  a dataset the tenant does not have                  -> see DATASET_CHECK below
  4. confluent_kafka reads <prefix>control and <prefix>deadletter (read_committed, from the
     beginning); python3-avro decodes every record with the writer schema its fingerprint names
     (schemas/*.avsc). Exactly one decision per job, the fields named above, DeadLetters naming
     the topic/partition/offset/key and carrying the bytes exactly; and the rejection reasons of
     b and d equal the error messages POST /v1/jobs answers for the same body, a and f are
     answered 201 there.
  5. The scheduler is still leading (never "stops leading"), then both children are stopped.

DATASET_CHECK: POST /v1/jobs answers 404 "dataset_id: no dataset ..." for g, and the scheduler
(given the object store, as lathed gives it) rejects the same record from Kafka with the same
field and message.

usage: upstream_python.py PATH/TO/lathe PATH/TO/lathed
Environment: LATHE_KAFKA_BOOTSTRAP (default 127.0.0.1:9092), LATHE_SOURCE_ROOT, the master key
(LATHE_MASTER_KEY_FILE or LATHE_MASTER_KEY; a fixed test key when neither is set), LATHE_S3_*
(or LATHE_STORE_DIR; a temporary directory store when neither is set).
Exits non-zero with a message on any failure, and when the broker is not reachable.
"""
import datetime
import glob
import io
import json
import os
import re
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid

import lt_test
from lt_test import BOOTSTRAP, ROOT, admin_client, kafka_conf, require_clients

require_clients("upstream")
import avro.io  # noqa: E402
import avro.schema  # noqa: E402
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

TEST_MASTER_KEY = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
CHILDREN = []


def fail(msg):
    print(f"upstream: FAIL: {msg}", file=sys.stderr)
    for c in CHILDREN:
        c.dump()
    raise SystemExit(1)


def log(msg):
    print(f"upstream: {msg}", flush=True)


# ---- CRC-64-AVRO, written from the Avro specification ("Schema Fingerprints") ----
from avro_spec import canonical_form, crc64_avro  # noqa: E402  (CRC-64-AVRO, PCF)


def load_schemas():
    """Every schemas/*.avsc: (name, version) -> (schema, fingerprint), and fingerprint -> (name,
    version, schema), so a reader resolves every fingerprint it meets."""
    by_name, by_fp = {}, {}
    for path in sorted(glob.glob(os.path.join(ROOT, "schemas", "*.avsc"))):
        m = re.fullmatch(r"([A-Za-z0-9]+)\.v(\d+)\.avsc", os.path.basename(path))
        if not m:
            continue
        with open(path, encoding="utf-8") as f:
            s = avro.schema.parse(f.read())
        fp = crc64_avro(canonical_form(s).encode())
        by_name[(m.group(1), int(m.group(2)))] = (s, fp)
        by_fp[fp] = (m.group(1), int(m.group(2)), s)
    if ("JobSubmitted", 1) not in by_name:
        fail(f"no schemas/JobSubmitted.v1.avsc under {ROOT}")
    return by_name, by_fp


def encode(schema, fp, datum):
    buf = io.BytesIO()
    avro.io.DatumWriter(schema).write(datum, avro.io.BinaryEncoder(buf))
    return b"\xc3\x01" + struct.pack("<Q", fp) + buf.getvalue()


def decode(by_fp, value, where):
    if value[:2] != b"\xc3\x01":
        fail(f"{where}: magic {value[:2].hex()} != c301")
    (fp,) = struct.unpack("<Q", value[2:10])
    if fp not in by_fp:
        fail(f"{where}: fingerprint {struct.pack('<Q', fp).hex()} names no schema in schemas/")
    name, _, schema = by_fp[fp]
    rec = avro.io.DatumReader(schema).read(avro.io.BinaryDecoder(io.BytesIO(value[10:])))
    return name, rec


# ---- children ----

def Child(name, argv, env):
    c = lt_test.Child(name, argv, env, tag="upstream")
    CHILDREN.append(c)
    return c


def run(argv, env, what):
    return lt_test.run(argv, env, what)


# ---- the API (stdlib HTTP) ----

def http(base, key, method, path, body=None, ctype="application/json"):
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        fail(f"{method} {path}: answer {status} is not JSON: {raw[:200]!r}")


# ---- the test ----

def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    lathe, lathed = sys.argv[1], sys.argv[2]
    by_name, by_fp = load_schemas()
    sub_schema, sub_fp = by_name[("JobSubmitted", 1)]

    admin = admin_client(fail)

    run_id = f"{os.getpid()}{secrets.token_hex(3)}"
    prefix = f"tup{run_id}."
    env = dict(os.environ, LATHE_KAFKA_BOOTSTRAP=BOOTSTRAP, LATHE_TOPIC_PREFIX=prefix,
               LATHE_SOURCE_ROOT=ROOT)
    if not env.get("LATHE_MASTER_KEY") and not env.get("LATHE_MASTER_KEY_FILE"):
        env["LATHE_MASTER_KEY"] = TEST_MASTER_KEY
    tmp = None
    if not env.get("LATHE_S3_ENDPOINT") and not env.get("LATHE_STORE_DIR"):
        tmp = tempfile.mkdtemp(prefix="lathe-upstream-")
        env["LATHE_STORE_DIR"] = tmp
    try:
        run([lathe, "admin", "topics"], env, "lathe admin topics")
        try:
            body(lathe, lathed, env, prefix, run_id, by_fp, sub_schema, sub_fp)
        finally:
            for c in CHILDREN:
                c.stop()
    finally:
        lt_test.delete_topics(admin, prefix)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def body(lathe, lathed, env, prefix, run_id, by_fp, sub_schema, sub_fp):
    tenant = f"up{run_id}"
    out = run([lathe, "admin", "tenant", "create", tenant, "--max-duration", "3600", "--json"], env,
              "lathe admin tenant create")
    try:
        api_key = json.loads(out)["api_key"]
    except (ValueError, KeyError):
        fail(f"lathe admin tenant create --json printed no api_key: {out!r}")

    sched = Child("scheduler", [lathed, "--role", "scheduler"], dict(env, LATHE_INSTANCE="sched-up"))
    api = Child("api", [lathed, "--role", "api", "--port", "0", "--operator-port", "0"], dict(env, LATHE_INSTANCE="api-up"))
    sched.wait_for(r"scheduler: leading \(", 90)
    if re.search(r"stops leading", sched.text()):
        fail("the scheduler stopped leading while starting")
    log("scheduler leads")
    port = int(api.wait_for(r"listening on http://127\.0\.0\.1:(\d+)", 60).group(1))
    base = f"http://127.0.0.1:{port}"

    # The API folds lathe.tenants asynchronously: wait for the key, then upload a dataset so that
    # a and f are valid on both paths.
    status, ans = 0, None
    for _ in range(300):
        status, ans = http(base, api_key, "GET", "/v1/jobs")
        if status == 200:
            break
        time.sleep(0.1)
    if status != 200:
        fail(f"the API never accepted the new tenant's key: {status} {ans}")
    jsonl = b'{"prompt":"Say hi","completion":"hi"}\n{"prompt":"2+2?","completion":"4"}\n'
    status, ans = http(base, api_key, "POST", "/v1/datasets?name=upstream", jsonl, "application/x-ndjson")
    if status != 201 or not isinstance(ans, dict) or not ans.get("id"):
        fail(f"dataset upload answered {status}: {ans}")
    dataset = ans["id"]
    log(f"tenant {tenant}, dataset {dataset}, api on port {port}")

    # ---- the records ----
    now = int(time.time() * 1000)
    cls_part = {"production": 0, "standard": 2, "preemptible": 4}

    def submitted(tag, priority="production", hp=None, **over):
        r = {
            "event_id": str(uuid.uuid4()), "occurred_at": EPOCH + datetime.timedelta(milliseconds=now),
            "producer": "upstream/python-test", "job_id": f"up-{run_id}-{tag}", "tenant_id": tenant,
            "base_model": "smollm2-135m", "dataset_id": dataset, "validation_dataset_id": None,
            "hyperparameters": dict({
                "epochs": 1, "max_steps": 0, "learning_rate": 0.0002, "lr_schedule": "cosine",
                "warmup_steps": 0, "weight_decay": 0.0, "lora_rank": 16, "lora_alpha": 32.0,
                "lora_dropout": 0.05, "target_modules": ["q_proj", "v_proj"], "batch_size": 4,
                "grad_accum": 1, "max_seq_len": 1024, "eval_interval": 0, "checkpoint_interval": 100,
                "checkpoint_interval_s": 600, "validation_fraction": 0.05, "seed": 0}, **(hp or {})),
            "priority": priority, "max_duration_s": 1800, "gpus": 0, "mode": "managed",
            "idempotency_key": None,
        }
        r.update(over)
        return r

    def api_body(r):
        """The same submission as the JSON body of POST /v1/jobs."""
        b = {k: r[k] for k in ("base_model", "dataset_id", "priority", "max_duration_s", "gpus", "mode")}
        b["hyperparameters"] = dict(r["hyperparameters"])
        return b

    recs = {
        "a": submitted("a", "production"),
        "b": submitted("b", "standard", hp={"learning_rate": 5.0}),
        "c": submitted("c", "standard", tenant_id=f"nobody{run_id}"),
        "d": submitted("d", "preemptible", max_duration_s=7200),
        "f": submitted("f", "standard"),
        "g": submitted("g", "preemptible", dataset_id=f"ds-none{run_id}"),
    }
    good_body = encode(sub_schema, sub_fp, recs["a"])
    garbage = {
        "e1": (f"up-{run_id}-e1".encode(), b"\x00\xffnot an avro record at all \xde\xad\xbe\xef" * 3),
        "e2": (f"up-{run_id}-e2".encode(), good_body[:len(good_body) // 2]),  # known fingerprint, body cut
    }
    order = [("a", 0), ("b", 2), ("c", 3), ("d", 4), ("g", 5), ("e1", 2), ("e2", 2), ("f", 2)]

    # An upstream service writes lathe.jobs with a principal that may (here the API's).
    p = Producer(kafka_conf("api", acks="all", **{"enable.idempotence": True}))
    where = {}

    def delivered(tag):
        def cb(err, msg):
            if err:
                fail(f"record {tag} not delivered: {err}")
            where[tag] = (msg.partition(), msg.offset())
        return cb

    topic_jobs = prefix + "jobs"
    for tag, part in order:
        if tag in garbage:
            key, value = garbage[tag]
        else:
            r = recs[tag]
            if part // 2 != list(cls_part).index(r["priority"]):
                fail(f"test bug: {tag} is {r['priority']} but goes to partition {part}")
            key, value = r["job_id"].encode(), encode(sub_schema, sub_fp, r)
        p.produce(topic_jobs, value=value, key=key, partition=part, on_delivery=delivered(tag))
        if tag in ("e2",):
            p.flush(30)  # f after the garbage, in partition order
    if p.flush(30) != 0 or len(where) != len(order):
        fail(f"the producer delivered {len(where)} of {len(order)} records")
    log("produced: " + ", ".join(f"{t}@{where[t][0]}/{where[t][1]}" for t, _ in order))

    # ---- the API's answers for the same bodies ----
    api_ans = {}
    for tag in ("b", "d", "g"):
        api_ans[tag] = http(base, api_key, "POST", "/v1/jobs", api_body(recs[tag]))
    for tag in ("b", "d", "g"):
        st, a = api_ans[tag]
        if st < 400 or not isinstance(a, dict) or "error" not in a:
            fail(f"POST /v1/jobs answered {st} for {tag}'s body, wanted an error: {a}")
    st, a = http(base, api_key, "POST", "/v1/jobs", api_body(recs["a"]))
    if st != 201:
        fail(f"POST /v1/jobs answered {st} for a's body (valid): {a}")

    # ---- read the decisions ----
    decisions, dead = read_outputs(prefix, by_fp, recs, len(garbage))

    def one(tag):
        ds = decisions.get(recs[tag]["job_id"], [])
        if len(ds) != 1:
            fail(f"{tag}: {len(ds)} decisions in {prefix}control, wanted exactly 1: {ds}")
        return ds[0]

    for tag in ("a", "f"):
        name, rec = one(tag)
        r = recs[tag]
        if name != "JobAccepted":
            fail(f"{tag} (valid): {name} {rec}")
        for k in ("tenant_id", "priority", "gpus", "max_duration_s"):
            if rec[k] != r[k]:
                fail(f"{tag}: JobAccepted.{k} = {rec[k]!r}, submitted {r[k]!r}")
        if rec["submitted_event_id"] != r["event_id"]:
            fail(f"{tag}: JobAccepted.submitted_event_id {rec['submitted_event_id']} != {r['event_id']}")

    def rejected(tag, field, words):
        name, rec = one(tag)
        if name != "JobRejected":
            fail(f"{tag}: {name}, wanted JobRejected: {rec}")
        if rec["field"] != field:
            fail(f"{tag}: JobRejected.field = {rec['field']!r}, wanted {field!r} ({rec['reason']})")
        for w in words:
            if w not in rec["reason"]:
                fail(f"{tag}: JobRejected.reason {rec['reason']!r} does not name {w!r}")
        if rec["submitted_event_id"] != recs[tag]["event_id"]:
            fail(f"{tag}: JobRejected.submitted_event_id {rec['submitted_event_id']} != {recs[tag]['event_id']}")
        if rec["tenant_id"] != recs[tag]["tenant_id"]:
            fail(f"{tag}: JobRejected.tenant_id {rec['tenant_id']} != {recs[tag]['tenant_id']}")
        return rec

    rb = rejected("b", "hyperparameters.learning_rate", ["hyperparameters.learning_rate", "5"])
    rc = rejected("c", "tenant_id", ["tenant_id", recs["c"]["tenant_id"]])
    rd = rejected("d", "max_duration_s", ["max_duration_s", "7200", "3600"])
    for tag, rec in (("b", rb), ("d", rd)):
        st, a = api_ans[tag]
        e = a["error"]
        if (e.get("field"), e.get("message"), e.get("code")) != (rec["field"], rec["reason"], rec["code"]):
            fail(f"{tag}: the API answered {st} {e} but the scheduler rejected the same submission from Kafka "
                 f"with field={rec['field']!r} code={rec['code']!r} reason={rec['reason']!r}")
    log(f"b rejected as the API does: {rb['reason']!r}")
    log(f"c rejected: {rc['reason']!r}")
    log(f"d rejected as the API does: {rd['reason']!r}")

    # g: the API knows the tenant's datasets; does the scheduler?
    st, a = api_ans["g"]
    ng, rg = one("g")
    if ng == "JobRejected" and rg["field"] == "dataset_id":
        if rg["reason"] != a["error"].get("message"):
            fail(f"g: the API answered {a['error']} but the scheduler rejected with {rg['reason']!r}")
        log(f"g rejected as the API does: {rg['reason']!r}")
    else:
        fail(f"g: POST /v1/jobs answers {st} {a['error']} for a dataset the tenant does not have, but the "
             f"scheduler wrote {ng} for the same record from Kafka")

    # DeadLetters: exactly one per garbage record, naming where it was read.
    for tag, (key, value) in garbage.items():
        part, off = where[tag]
        hits = [d for d in dead if d["partition"] == part and d["offset"] == off]
        if len(hits) != 1:
            fail(f"{tag}: {len(hits)} DeadLetters for {topic_jobs} {part}/{off}, wanted 1 (all: {dead})")
        d = hits[0]
        if d["topic"] != topic_jobs:
            fail(f"{tag}: DeadLetter.topic {d['topic']!r} != {topic_jobs!r}")
        if d["key"] != key or d["payload"] != value:
            fail(f"{tag}: DeadLetter key/payload are not the original bytes: {d}")
        fp_hex = struct.pack("<Q", sub_fp).hex() if tag == "e2" else None
        if tag == "e2" and (d["fingerprint"] or "").lower() != fp_hex:
            fail(f"{tag}: DeadLetter.fingerprint {d['fingerprint']!r}, wanted {fp_hex}")
        if tag == "e1" and d["fingerprint"] is not None:
            fail(f"{tag}: DeadLetter.fingerprint {d['fingerprint']!r} for bytes with no header")
        if not d["reason"] or not d["error_code"]:
            fail(f"{tag}: DeadLetter without reason/error_code: {d}")
        log(f"{tag} dead-lettered at {part}/{off}: {d['error_code']}: {d['reason']}")
    if len(dead) != len(garbage):
        fail(f"{len(dead)} DeadLetters in {prefix}deadletter, wanted {len(garbage)}: {dead}")

    # Crypto-shred the dataset: the shared object store keeps nothing of this run.
    st, a = http(base, api_key, "DELETE", f"/v1/datasets/{dataset}")
    if st not in (200, 204):
        fail(f"DELETE /v1/datasets/{dataset} answered {st}: {a}")
    if sched.p.poll() is not None:
        fail(f"the scheduler exited ({sched.p.returncode})")
    if "stops leading" in sched.text():
        fail("the scheduler stopped leading during the test")
    log("OK (upstream JobSubmitted validated like the API; garbage dead-lettered; the consumer went on)")


def read_outputs(prefix, by_fp, recs, n_garbage):
    """Reads <prefix>control and <prefix>deadletter from the beginning (read_committed) until every
    submission has a decision and every garbage record a DeadLetter, then a quiet 3 s more to see
    duplicates."""
    admin = AdminClient(kafka_conf())
    md = admin.list_topics(timeout=10).topics
    tps = []
    for t in (prefix + "control", prefix + "deadletter"):
        if t not in md:
            fail(f"topic {t} does not exist")
        tps += [TopicPartition(t, pid, -2) for pid in md[t].partitions]  # -2: OFFSET_BEGINNING
    c = Consumer(kafka_conf(**{"group.id": prefix + "upstream-reader",
                               "isolation.level": "read_committed", "enable.auto.commit": False,
                               "auto.offset.reset": "earliest"}))
    c.assign(tps)
    want = {r["job_id"] for r in recs.values()}
    decisions, dead = {}, []
    deadline, settled_at = time.time() + 90, None
    while time.time() < deadline:
        m = c.poll(0.5)
        done = want <= set(decisions) and len(dead) >= n_garbage
        if done and settled_at is None:
            settled_at = time.time()
        if settled_at is not None and time.time() - settled_at > 3:
            break
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                continue
            fail(f"consume: {m.error()}")
        where = f"{m.topic()} {m.partition()}/{m.offset()}"
        name, rec = decode(by_fp, m.value(), where)
        if m.topic().endswith("deadletter"):
            if name != "DeadLetter":
                fail(f"{where}: {name} in the deadletter topic")
            dead.append(rec)
        elif name in ("JobAccepted", "JobRejected"):
            if m.key() is None or m.key().decode() != rec["job_id"]:
                fail(f"{where}: {name} key {m.key()!r} is not its job_id {rec['job_id']!r}")
            decisions.setdefault(rec["job_id"], []).append((name, rec))
    c.close()
    missing = sorted(want - set(decisions))
    if missing:
        fail(f"no JobAccepted/JobRejected within 90 s for {missing}")
    return decisions, dead


if __name__ == "__main__":
    main()
