#!/usr/bin/python3
"""events: Lathe's streams read by tools that know nothing of Lathe (docs/EVENTS.md).

Through the real broker, under a scratch topic prefix:
  1. `lathe topic produce` (Lathe's encoder and producer) writes one record of every record type
     to its topic, and python3-confluent-kafka one more StepCompleted, v1, with no headers (a
     record from before the headers, or from an upstream producer).
  2. kcat, a client that knows no Avro, shows each Lathe record's CloudEvents headers: ce_type
     is dev.lathe.<the Avro record name>, the fingerprint header equals bytes 2..9 of the value,
     ce_id the record's event_id.
  3. docs/examples/consume.py, with Debian's python3-avro 1.11.1, decodes every one of them,
     the header-less record too, to the fields that were sent.
  4. With --java, instead of 2 and 3: docs/examples/java/Consume.java (Apache Avro's
     BinaryMessageDecoder) decodes every one of them to its type and event_id. Its jars come
     from Maven (docs/examples/java/pom.xml); exit 77 (skipped) when Maven cannot get them.

usage: events_python.py PATH/TO/lathe [--java]
Environment: the stack's (`eval "$(ops/stack env)"`), LATHE_SOURCE_ROOT.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

from lt_test import BOOTSTRAP, ROOT, admin_client, admin_topics, delete_topics, kafka_conf, require_clients

require_clients("events")
import avro.schema  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "schemas"))
sys.path.insert(0, os.path.join(ROOT, "docs", "examples"))
import consume  # noqa: E402  the example under test, for its fingerprint only
import gen_events  # noqa: E402  which topic each record goes to

EXAMPLE = os.path.join(ROOT, "docs", "examples", "consume.py")
T0 = 1764400000000


def fail(msg):
    print(f"events: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def sample(t, name, i):
    """(JSON value for `lathe topic produce`, the value consume.py should print) for type t."""
    if isinstance(t, list):  # nullable: the non-null branch, so every field says something
        return sample([x for x in t if x != "null"][0], name, i)
    if isinstance(t, dict):
        k = t["type"]
        if k == "record":
            pairs = {f["name"]: sample(f["type"], f["name"], i) for f in t["fields"]}
            return ({n: p[0] for n, p in pairs.items()}, {n: p[1] for n, p in pairs.items()})
        if k == "array":
            v, e = sample(t["items"], name, i)
            return [v], [e]
        if k == "map":
            v, e = sample(t["values"], name, i)
            return {"k": v}, {"k": e}
        if k == "enum":
            return t["symbols"][-1], t["symbols"][-1]
        if t.get("logicalType") == "timestamp-millis":
            return T0 + i, T0 + i
        return sample(k, name, i)
    if t == "string":
        v = f"{name}-{i}"
        return v, v
    if t in ("int", "long"):
        return 7 + i, 7 + i
    if t in ("float", "double"):
        return 0.5 + i, 0.5 + i
    if t == "boolean":
        return True, True
    if t == "bytes":
        return "ab", "6162"
    if t == "null":
        return None, None
    fail(f"no sample for type {t!r}")


def newest_schemas():
    out = {}
    for name, versions in gen_events.schemas(ROOT).items():
        v = max(versions)
        out[name] = (v, versions[v])
    return out


def produce_all(lathe, env, schemas):
    """One record of every type through `lathe topic produce`; returns {event_id: (topic, name,
    version, expected record)}."""
    sent = {}
    for i, (name, (version, js)) in enumerate(sorted(schemas.items())):
        datum, want = sample(js, name, i)
        eid = str(uuid.uuid4())
        datum.update(event_id=eid, producer="events-test/1")
        want.update(event_id=eid, producer="events-test/1")
        base = gen_events.RECORDS[name][0][0]
        p = subprocess.run([lathe, "topic", "produce", base, name], input=json.dumps(datum) + "\n",
                           capture_output=True, text=True, env=env, timeout=120)
        if p.returncode != 0:
            fail(f"lathe topic produce {base} {name} exited {p.returncode}: {p.stderr}")
        sent[eid] = (base, name, version, want)
    return sent


def produce_bare(prefix):
    """A StepCompleted v1 without headers, as python3-avro writes it."""
    import datetime
    import io
    import struct
    import avro.io
    with open(os.path.join(ROOT, "schemas", "StepCompleted.v1.avsc")) as f:
        text = f.read()
    js = json.loads(text)
    datum, want = sample(js, "StepCompleted", 99)
    eid = str(uuid.uuid4())
    datum.update(event_id=eid, producer="upstream/py")
    want.update(event_id=eid, producer="upstream/py")
    datum["occurred_at"] = consume.EPOCH + datetime.timedelta(milliseconds=datum["occurred_at"])
    buf = io.BytesIO()
    avro.io.DatumWriter(avro.schema.parse(text)).write(datum, avro.io.BinaryEncoder(buf))
    fp = struct.pack("<Q", consume.crc64_avro(consume.canonical_form(js).encode()))
    p = Producer(kafka_conf(acks="all"))
    p.produce(prefix + "progress", value=b"\xc3\x01" + fp + buf.getvalue(), key=want["job_id"].encode())
    if p.flush(30) != 0:
        fail("the header-less record was not delivered")
    return eid, ("progress", "StepCompleted", 1, want)


def consume_topic(prefix, base, n):
    props = os.path.join(os.environ["LATHE_KAFKA_CONFIG_DIR"], "admin.properties") \
        if os.environ.get("LATHE_KAFKA_CONFIG_DIR") else None
    argv = ["/usr/bin/python3", EXAMPLE, "--schemas", os.path.join(ROOT, "schemas"),
            "--topic", prefix + base, "--bootstrap", BOOTSTRAP, "--group", prefix + "consume-" + base, "--max", str(n), "--timeout", "30"]
    if props:
        argv += ["--config", props]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"consume.py --topic {prefix + base} exited {p.returncode}: {p.stderr}")
    lines = [json.loads(l) for l in p.stdout.splitlines()]
    if len(lines) != n:
        fail(f"consume.py read {len(lines)} of {n} records of {prefix + base}:\n{p.stdout}")
    return lines


def same(want, got, what):
    for k, v in want.items():
        w = got.get(k)
        if isinstance(v, dict) and isinstance(w, dict):
            same(v, w, f"{what}.{k}")
        elif isinstance(v, float) and isinstance(w, (int, float)):
            if abs(v - w) > 1e-9 * max(1.0, abs(v)):
                fail(f"{what}: field {k}: {v!r} != {w!r}")
        elif v != w:
            fail(f"{what}: field {k}: sent {v!r}, consume.py printed {w!r}")


def kcat_headers(prefix, base):
    """{(partition, offset): {header: value}} of a topic, as kcat prints them."""
    argv = ["kcat", "-b", BOOTSTRAP, "-C", "-t", prefix + base, "-o", "beginning", "-e", "-q",
            "-f", "%p %o %h\n"]
    if os.environ.get("LATHE_KAFKA_CONFIG_DIR"):
        argv[1:1] = ["-F", os.path.join(os.environ["LATHE_KAFKA_CONFIG_DIR"], "admin.properties")]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"kcat exited {p.returncode}: {p.stderr}")
    out = {}
    for line in p.stdout.splitlines():
        part, off, *rest = line.split(" ", 2)
        hs = rest[0] if rest else ""
        out[(int(part), int(off))] = dict(h.split("=", 1) for h in hs.split(",") if "=" in h)
    return out


def main():
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--java"]):
        sys.exit(__doc__)
    lathe, java = sys.argv[1], sys.argv[2:] == ["--java"]
    jars = java_jars() if java else None
    admin = admin_client(fail)
    prefix = f"events-{os.getpid()}-{int(time.time())}."
    admin_topics(lathe, prefix, fail)
    env = dict(os.environ, LATHE_KAFKA_BOOTSTRAP=BOOTSTRAP, LATHE_TOPIC_PREFIX=prefix)
    try:
        schemas = newest_schemas()
        sent = produce_all(lathe, env, schemas)
        bare_id, bare = produce_bare(prefix)
        sent[bare_id] = bare
        if java:
            check_java(prefix, sent, bare_id, jars)
        else:
            check(prefix, sent, bare_id)
    finally:
        delete_topics(admin, prefix)
        if jars:
            shutil.rmtree(jars, ignore_errors=True)
    if java:
        print(f"events: OK (Java: {len(sent)} records of {len(sent) - 1} types decoded by "
              "docs/examples/java/Consume.java, one without headers)")
        return
    print(f"events: OK ({len(sent)} records of {len(sent) - 1} types: headers by kcat, decoded by "
          "docs/examples/consume.py with python3-avro, one without headers)")


def java_jars():
    """A temporary folder with the Java example's jars, or exit 77 when Java or Maven lacks."""
    if not all(shutil.which(t) for t in ("java", "javac", "mvn")):
        print("events: SKIP: java, javac or mvn not found (a JDK: ops/setup installs only a JRE)")
        sys.exit(77)
    d = tempfile.mkdtemp(prefix="lathe-events-java-")
    argv = ["mvn", "-B", "-q", "-f", os.path.join(ROOT, "docs", "examples", "java", "pom.xml"),
            "dependency:copy-dependencies", "-DincludeScope=runtime", "-DoutputDirectory=" + d]
    if os.environ.get("LATHE_MAVEN_REPO"):
        argv.append("-Dmaven.repo.local=" + os.environ["LATHE_MAVEN_REPO"])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
        print(f"events: SKIP: Maven could not fetch the Java example's jars:\n{p.stdout[-2000:]}")
        sys.exit(77)
    # Compiled once here rather than by the source launcher on each of the topics' runs.
    p = subprocess.run(["javac", "-d", d, "-cp", os.path.join(d, "*"),
                        os.path.join(ROOT, "docs", "examples", "java", "Consume.java")],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        fail(f"javac docs/examples/java/Consume.java exited {p.returncode}: {p.stderr}")
    return d


def check_java(prefix, sent, bare_id, jars):
    by_topic = {}
    for eid, (base, *_rest) in sent.items():
        by_topic.setdefault(base, []).append(eid)
    props = os.path.join(os.environ["LATHE_KAFKA_CONFIG_DIR"], "admin.properties") \
        if os.environ.get("LATHE_KAFKA_CONFIG_DIR") else None
    seen = set()
    for base, ids in sorted(by_topic.items()):
        argv = ["java", "-cp", jars + os.pathsep + os.path.join(jars, "*"), "Consume",
                os.path.join(ROOT, "schemas"), prefix + base, BOOTSTRAP]
        argv += [props or "/dev/null", str(len(ids)), prefix + "java-" + base]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            fail(f"Consume.java --topic {prefix + base} exited {p.returncode}: {p.stderr[-3000:]}")
        lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        if len(lines) != len(ids):
            fail(f"Consume.java read {len(lines)} of {len(ids)} records of {prefix + base}:\n{p.stdout}")
        for line in lines:
            if "error" in line:
                fail(f"Consume.java could not decode a record of {base}: {line}")
            eid = line["event_id"]
            if eid not in sent:
                fail(f"{base}: Consume.java printed a record nobody sent: {line}")
            _, name, version, _want = sent[eid]
            want_ce = None if eid == bare_id else "dev.lathe." + name
            if (line["type"], line["version"], line["ce_type"]) != (name, version, want_ce):
                fail(f"{name} v{version} on {base}: Consume.java says {line}")
            seen.add(eid)
    if seen != set(sent):
        fail(f"Consume.java missed {len(set(sent) - seen)} records")


def check(prefix, sent, bare_id):
    by_topic = {}
    for eid, (base, *_rest) in sent.items():
        by_topic.setdefault(base, []).append(eid)
    types = set()
    for base, ids in sorted(by_topic.items()):
        heads = kcat_headers(prefix, base)
        for line in consume_topic(prefix, base, len(ids)):
            if "error" in line:
                fail(f"consume.py could not decode a record of {base}: {line['error']}")
            rec = line["record"]
            eid = rec.get("event_id")
            if eid not in sent:
                fail(f"{base}: a record nobody sent: {line}")
            _, name, version, want = sent[eid]
            what = f"{name} on {base}"
            if (line["type"], line["version"]) != (name, version):
                fail(f"{what}: consume.py says {line['type']} v{line['version']}")
            same(want, rec, what)
            h = heads.get((line["partition"], line["offset"]))
            if h is None:
                fail(f"{what}: kcat did not print partition {line['partition']} offset {line['offset']}")
            if eid == bare_id:
                if h or line["headers"]:
                    fail(f"{what}: the bare record has headers {h}")
                types.add("(bare)")
                continue
            # The value's bytes 2..9 as consume.py read them, against what kcat shows.
            wanted = {"ce_specversion": "1.0", "ce_type": "dev.lathe." + name, "ce_id": eid,
                      "ce_source": "lathe/events-test/1", "content-type": "application/avro",
                      "lathe_schema_fingerprint": line["fingerprint"],
                      "ce_dataschema": f"lathe:schema/{name}/v{version}/{line['fingerprint']}"}
            for k, v in wanted.items():
                if h.get(k) != v:
                    fail(f"{what}: kcat shows {k}={h.get(k)!r}, want {v!r} (all: {h})")
            if not h.get("ce_time", "").endswith("Z"):
                fail(f"{what}: ce_time {h.get('ce_time')!r}")
            if line["headers"] != h:
                fail(f"{what}: confluent-kafka and kcat disagree on headers: {line['headers']} / {h}")
            types.add(name)
    missing = set(gen_events.RECORDS) - types
    if missing:
        fail(f"no record decoded of {sorted(missing)}")
    if "(bare)" not in types:
        fail("the record without headers was not read")


if __name__ == "__main__":
    main()
