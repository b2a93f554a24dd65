#!/usr/bin/python3
"""Interop through the real broker: Lathe's C code and independent Python libraries agree.

Run by Debian's /usr/bin/python3 with python3-confluent-kafka and python3-avro:

  1. C -> Python: `lathe topic produce` (lt_avro encoding + lt_bus idempotent producer) writes
     StepCompleted records; confluent_kafka reads them (read_committed); each value must start
     with C3 01, carry the CRC-64-AVRO fingerprint of the writer schema's Parsing Canonical Form
     (python3-avro's canonical_form, CRC computed here from the Avro specification), and its
     body must decode with python3-avro and the writer schema from schemas/ to the same fields.
  2. Python -> C: python3-avro encodes StepCompleted v1 (an older writer) and v2 records, framed
     as single-object messages here, confluent_kafka produces them (acks=all), plus one
     undecodable record; `lathe topic tail` must print each decoded record as JSON with the
     same fields (v1 resolved to v2 with defaults), an error line naming partition and offset
     for the bad one, and go on to the records after it.

usage: interop_kafka.py PATH/TO/lathe
Environment: LATHE_KAFKA_BOOTSTRAP (default 127.0.0.1:9092), LATHE_SOURCE_ROOT.
Exits non-zero with a message on any mismatch, and when the broker is not reachable.
"""
import datetime
import io
import json
import os
import struct
import subprocess
import sys
import time
import uuid

from lt_test import BOOTSTRAP, ROOT, admin_client, admin_topics, kafka_conf, require_clients

require_clients("interop_kafka")
import avro.io  # noqa: E402
import avro.schema  # noqa: E402
from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import NewTopic  # noqa: E402

N = 20


def fail(msg):
    print(f"interop_kafka: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


from avro_spec import canonical_form, crc64_avro  # noqa: E402  (CRC-64-AVRO, PCF from the specification)


def load_schema(name, version):
    with open(os.path.join(ROOT, "schemas", f"{name}.v{version}.avsc")) as f:
        s = avro.schema.parse(f.read())
    fp = crc64_avro(canonical_form(s).encode())
    return s, fp


def step_record(i, version):
    r = {
        "event_id": str(uuid.uuid4()), "occurred_at": 1764400000000 + i, "producer": "interop/py",
        "job_id": f"job-{i % 5}", "tenant_id": "tenant-a", "attempt": 1, "step": i + 1,
        "total_steps": N, "loss": 2.0 / (i + 1), "learning_rate": 1e-4, "tokens": 1024,
        "tokens_per_s": 81.5 + i, "elapsed_ms": 1000 * i, "eta_ms": 1000 * (N - i),
    }
    if version >= 2:
        r["epoch"] = i / N
        r["grad_norm"] = None if i % 2 else 0.5 + i
    return r


EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def same(a, b, what):
    for k, v in a.items():
        w = b.get(k)
        if isinstance(w, datetime.datetime):  # python3-avro reads timestamp-millis as datetime
            w = (w - EPOCH) // datetime.timedelta(milliseconds=1)
        if isinstance(v, float) and isinstance(w, (int, float)):
            if abs(v - w) > 1e-12 * max(1.0, abs(v)):
                fail(f"{what}: field {k}: {v!r} != {w!r}")
        elif v != w:
            fail(f"{what}: field {k}: {v!r} != {w!r}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    lathe = sys.argv[1]
    admin = admin_client(fail)
    run = f"interop-{os.getpid()}-{int(time.time())}."
    c2py, py2c = run + "c2py", run + "py2c"
    admin_topics(lathe, run, fail)  # the admin principal's ACLs under this prefix
    futs = admin.create_topics([NewTopic(c2py, 3, 1), NewTopic(py2c, 1, 1)])
    for t, f in futs.items():
        f.result(timeout=30)
    env = dict(os.environ, LATHE_KAFKA_BOOTSTRAP=BOOTSTRAP, LATHE_TOPIC_PREFIX=run)
    try:
        c_to_python(lathe, env, c2py)
        python_to_c(lathe, env, py2c)
    finally:
        mine = [t for t in admin.list_topics(timeout=10).topics if t.startswith(run)]
        for f in admin.delete_topics(mine).values():
            try:
                f.result(timeout=30)
            except Exception:
                pass
    print("interop_kafka: OK (C -> python3-avro and python3-avro -> C through the broker)")


def c_to_python(lathe, env, topic):
    schema, fp = load_schema("StepCompleted", 2)
    sent = [step_record(i, 2) for i in range(N)]
    p = subprocess.run([lathe, "topic", "produce", topic.split(".")[-1], "StepCompleted"],
                       input="".join(json.dumps(r) + "\n" for r in sent), capture_output=True,
                       text=True, env=env, timeout=120)
    if p.returncode != 0:
        fail(f"lathe topic produce exited {p.returncode}: {p.stderr}")
    acks = [json.loads(l) for l in p.stdout.splitlines()]
    if len(acks) != N:
        fail(f"lathe topic produce acknowledged {len(acks)} of {N} records")

    c = Consumer(kafka_conf(**{"group.id": topic + ".py",
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                  "enable.auto.commit": False}))
    c.subscribe([topic])
    got = {}
    deadline = time.time() + 60
    while len(got) < N and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            fail(f"consume {topic}: {m.error()}")
        v = m.value()
        if v[:2] != b"\xc3\x01":
            fail(f"partition {m.partition()} offset {m.offset()}: magic {v[:2].hex()} != c301")
        (got_fp,) = struct.unpack("<Q", v[2:10])
        if got_fp != fp:
            fail(f"fingerprint {struct.pack('<Q', got_fp).hex()} != "
                 f"{struct.pack('<Q', fp).hex()} (CRC-64-AVRO of StepCompleted v2)")
        rec = avro.io.DatumReader(schema).read(avro.io.BinaryDecoder(io.BytesIO(v[10:])))
        if m.key().decode() != rec["job_id"]:
            fail(f"key {m.key()!r} is not the record's job_id {rec['job_id']!r}")
        got[rec["event_id"]] = (rec, m.partition(), m.offset())
    c.close()
    if len(got) != N:
        fail(f"python read {len(got)} of {N} records C produced")
    for i, r in enumerate(sent):
        rec, part, off = got[r["event_id"]]
        same(r, rec, f"C->python record {i}")
        if (acks[i]["partition"], acks[i]["offset"]) != (part, off):
            fail(f"record {i}: C acknowledged {acks[i]} but it is at {part}/{off}")
    print(f"interop_kafka: C -> python: {N} records, magic, fingerprint and fields match")


def python_to_c(lathe, env, topic):
    s1, fp1 = load_schema("StepCompleted", 1)
    s2, fp2 = load_schema("StepCompleted", 2)
    p = Producer(kafka_conf(acks="all", **{"enable.idempotence": True}))
    sent = []
    for i in range(N):
        version = 1 if i % 2 == 0 else 2
        schema, fp = (s1, fp1) if version == 1 else (s2, fp2)
        r = step_record(i, version)
        buf = io.BytesIO()
        datum = dict(r, occurred_at=EPOCH + datetime.timedelta(milliseconds=r["occurred_at"]))
        avro.io.DatumWriter(schema).write(datum, avro.io.BinaryEncoder(buf))
        value = b"\xc3\x01" + struct.pack("<Q", fp) + buf.getvalue()
        p.produce(topic, value=value, key=r["job_id"].encode())
        sent.append((version, r))
        if i == N // 2:
            p.produce(topic, value=b"\xc3\x01" + b"\x00" * 8 + b"garbage", key=b"bad")
            sent.append((0, None))
    if p.flush(30) != 0:
        fail("python producer did not deliver every record")
    t = subprocess.run([lathe, "topic", "tail", topic.split(".")[-1], "--from-beginning",
                        "--max", str(len(sent)), "--timeout-ms", "20000"],
                       capture_output=True, text=True, env=env, timeout=120)
    if t.returncode != 0:
        fail(f"lathe topic tail exited {t.returncode}: {t.stderr}")
    lines = [json.loads(l) for l in t.stdout.splitlines()]
    if len(lines) != len(sent):
        fail(f"lathe topic tail printed {len(lines)} lines for {len(sent)} records:\n{t.stdout}")
    for off, ((version, r), line) in enumerate(zip(sent, lines)):
        if line["offset"] != off or line["partition"] != 0:
            fail(f"line {off}: partition/offset {line['partition']}/{line['offset']}")
        if version == 0:
            err = line.get("error", "")
            if f"offset {off}" not in err or "partition 0" not in err:
                fail(f"undecodable record: error line does not name partition/offset: {line}")
            continue
        if "error" in line:
            fail(f"record {off}: C could not decode what python3-avro wrote: {line['error']}")
        if line["type"] != "StepCompleted" or line["writer_version"] != version:
            fail(f"record {off}: type/version {line['type']}/{line['writer_version']}")
        if line["key"] != r["job_id"]:
            fail(f"record {off}: key {line['key']!r}")
        want = dict(r)
        if version == 1:  # resolved to v2: the new fields take their defaults
            want.update(epoch=0.0, grad_norm=None)
        same(want, line["record"], f"python->C record {off}")
    print(f"interop_kafka: python -> C: {N} records (v1 and v2 writers) decoded, "
          "bad record reported and skipped")


if __name__ == "__main__":
    main()
