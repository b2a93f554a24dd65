#!/usr/bin/python3
"""Independent checks of Lathe's Avro schemas and encoding with Debian's python3-avro.

Run by tests/test_avro.c (Criterion) with /usr/bin/python3 — Debian's python3-avro is visible only
to the system interpreter.

  schema_check.py check OURS.tsv SCHEMA_DIR
      OURS.tsv: name<TAB>version<TAB>fingerprint-hex<TAB>canonical-form, one line per schema, as
      Lathe's registry computed them. Checks, for every schemas/*.avsc: our canonical form equals
      python3-avro's canonical_form; our fingerprint equals a CRC-64-AVRO computed here from the
      specification; the file set equals the registry's; and the house rules (docs on every field,
      event_id/occurred_at/producer, timestamp-millis, attempt on attempt-scoped records).
  schema_check.py samples SCHEMA_DIR OUT.tsv
      Writes one sample per schema version: name<TAB>version<TAB>JSON datum<TAB>hex of the
      single-object message python3-avro wrote (header built here).
  schema_check.py verify SCHEMA_DIR IN.tsv
      IN.tsv: name<TAB>version<TAB>JSON datum<TAB>hex of a single-object message Lathe wrote.
      Checks the header, decodes the body with python3-avro and compares it with the datum.
  schema_check.py evolve SCHEMA_DIR
      python3-avro resolves StepCompleted v1 data with the v2 schema and v2 data with v1.
"""
import glob
import io
import json
import os
import re
import sys

import datetime

import avro.io
import avro.schema

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def ts_millis(ms):
    """python3-avro reads and writes timestamp-millis as aware datetimes."""
    return EPOCH + datetime.timedelta(milliseconds=ms)

from avro_spec import PRIMITIVES, canonical_form as python_canonical, crc64_avro, fp_bytes  # noqa: E402


def load_schemas(schema_dir):
    out = {}
    for path in sorted(glob.glob(os.path.join(schema_dir, "*.avsc"))):
        m = re.fullmatch(r"([A-Za-z0-9]+)\.v(\d+)\.avsc", os.path.basename(path))
        if not m:
            raise SystemExit("%s: bad file name" % path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        out[(m.group(1), int(m.group(2)))] = (json.loads(text), avro.schema.parse(text))
    return out


ATTEMPT_SCOPED = {"JobDispatched", "AttemptStarted", "PreemptRequested", "CheckpointCommitted",
                  "AttemptStopped", "JobCompleted", "JobFailed", "JobCancelled", "CleanupDone",
                  "StepCompleted", "EvalCompleted", "ArtifactPublished"}
JOB_RECORDS = ATTEMPT_SCOPED | {"JobSubmitted", "JobAccepted", "JobRejected", "CancelRequested", "JobDeleted"}


def house_rules(key, js, problems):
    name = "%s v%d" % key

    def walk(t, where):
        if isinstance(t, list):
            for b in t:
                walk(b, where)
        elif isinstance(t, dict):
            if t.get("type") == "record":
                if not t.get("doc"):
                    problems.append("%s: record %s has no doc" % (name, t.get("name")))
                for f in t["fields"]:
                    if not f.get("doc"):
                        problems.append("%s: field %s.%s has no doc" % (name, where, f["name"]))
                    walk(f["type"], where + "." + f["name"])
            elif t.get("type") in ("array", "map"):
                walk(t.get("items", t.get("values")), where)
            elif t.get("type") == "enum" and not t.get("doc"):
                problems.append("%s: enum %s has no doc" % (name, t.get("name")))

    walk(js, key[0])
    fields = {f["name"]: f for f in js["fields"]}
    for req, typ in (("event_id", "string"), ("producer", "string")):
        if fields.get(req, {}).get("type") != typ:
            problems.append("%s: needs %s (%s)" % (name, req, typ))
    # The producer reads the envelope in place for the CloudEvents headers (src/lib/lt_bus_ce.c).
    if [f["name"] for f in js["fields"][:3]] != ["event_id", "occurred_at", "producer"]:
        problems.append("%s: must open with event_id, occurred_at, producer, in that order" % name)
    occ = fields.get("occurred_at", {}).get("type")
    if occ != {"type": "long", "logicalType": "timestamp-millis"}:
        problems.append("%s: occurred_at must be a timestamp-millis long" % name)
    if key[0] in JOB_RECORDS:
        for req in ("job_id", "tenant_id"):
            if fields.get(req, {}).get("type") != "string":
                problems.append("%s: job records carry %s (string)" % (name, req))
    if key[0] in ATTEMPT_SCOPED and fields.get("attempt", {}).get("type") != "int":
        problems.append("%s: attempt-scoped records carry attempt (int)" % name)
    for f in js["fields"]:
        if f["name"].endswith("_id") and f["type"] not in ("string", ["null", "string"]):
            problems.append("%s: id %s must be a string" % (name, f["name"]))


def cmd_check(ours_path, schema_dir):
    schemas = load_schemas(schema_dir)
    ours = {}
    with open(ours_path, encoding="utf-8") as f:
        for line in f:
            name, version, fphex, canon = line.rstrip("\n").split("\t")
            ours[(name, int(version))] = (fphex, canon)
    problems = []
    if set(ours) != set(schemas):
        problems.append("registry and schemas/ differ: only in registry %s, only in schemas/ %s" %
                        (sorted(set(ours) - set(schemas)), sorted(set(schemas) - set(ours))))
    for key, (js, parsed) in sorted(schemas.items()):
        house_rules(key, js, problems)
        if key not in ours:
            continue
        fphex, canon = ours[key]
        ref = python_canonical(parsed)
        if canon != ref:
            problems.append("%s v%d: canonical form differs\n  ours:   %s\n  python: %s" %
                            (key[0], key[1], canon, ref))
        want = fp_bytes(crc64_avro(ref.encode("utf-8"))).hex()
        if fphex != want:
            problems.append("%s v%d: fingerprint %s, CRC-64-AVRO of the canonical form is %s" %
                            (key[0], key[1], fphex, want))
    for p in problems:
        print("schema_check:", p)
    print("schema_check: %d schemas checked, %d problems" % (len(schemas), len(problems)))
    return 1 if problems else 0


# ---- sample data: every field set, nothing at its default ----

def sample(t, names, tag, n):
    """(JSON form as Lathe writes it, python datum) for schema t."""
    if isinstance(t, list):
        branch = next(b for b in t if b != "null")
        return sample(branch, names, tag, n)
    if isinstance(t, str):
        if t in names:
            return sample(names[t], names, tag, n)
        if t == "string":
            s = "%s-%d-\u00e9\u6f22" % (tag, n)
            return s, s
        if t == "bytes":
            raw = bytes([0, 1, 0x7F, 0x80, 0xFF, n & 0xFF])
            return raw.decode("latin-1"), raw
        if t == "int":
            return -7 - n, -7 - n
        if t == "long":
            return 1_700_000_000_123 + n, 1_700_000_000_123 + n
        if t in ("double", "float"):
            return 1.5 + n, 1.5 + n
        if t == "boolean":
            return True, True
        if t == "null":
            return None, None
        raise ValueError(t)
    typ = t["type"]
    if isinstance(typ, (dict, list)):
        return sample(typ, names, tag, n)
    if t.get("logicalType") == "timestamp-millis":
        ms = 1_700_000_000_123 + n
        return ms, ts_millis(ms)
    if typ in PRIMITIVES:
        return sample(typ, names, tag, n)
    if typ == "record":
        names[t["name"]] = t
        names["lathe." + t["name"]] = t
        j, d = {}, {}
        for i, f in enumerate(t["fields"]):
            j[f["name"]], d[f["name"]] = sample(f["type"], names, f["name"], n + i)
        return j, d
    if typ == "enum":
        names[t["name"]] = t
        names["lathe." + t["name"]] = t
        s = t["symbols"][-1]
        return s, s
    if typ == "array":
        items = [sample(t["items"], names, tag, n + k) for k in range(2)]
        return [a for a, _ in items], [b for _, b in items]
    if typ == "map":
        a, b = sample(t["values"], names, tag, n)
        return {"k": a}, {"k": b}
    raise ValueError(typ)


def write_single_object(parsed, datum):
    buf = io.BytesIO()
    avro.io.DatumWriter(parsed).write(datum, avro.io.BinaryEncoder(buf))
    fp = fp_bytes(crc64_avro(python_canonical(parsed).encode("utf-8")))
    return b"\xc3\x01" + fp + buf.getvalue()


def cmd_samples(schema_dir, out_path):
    schemas = load_schemas(schema_dir)
    with open(out_path, "w", encoding="utf-8") as out:
        for (name, version), (js, parsed) in sorted(schemas.items()):
            j, d = sample(js, {}, name, version)
            msg = write_single_object(parsed, d)
            out.write("%s\t%d\t%s\t%s\n" % (name, version, json.dumps(j, ensure_ascii=False), msg.hex()))
    return 0


def to_python(t, j, names):
    """Lathe's JSON form -> python3-avro datum (bytes from code points)."""
    if j is None:
        return None
    if isinstance(t, list):
        branch = next(b for b in t if b != "null")
        return to_python(branch, j, names)
    if isinstance(t, str):
        if t in names:
            return to_python(names[t], j, names)
        return j.encode("latin-1") if t == "bytes" else j
    typ = t["type"]
    if t.get("logicalType") == "timestamp-millis":
        return ts_millis(j)
    if isinstance(typ, (dict, list)) or typ in PRIMITIVES:
        return to_python(typ, j, names)
    if typ == "record":
        names[t["name"]] = t
        names["lathe." + t["name"]] = t
        return {f["name"]: to_python(f["type"], j[f["name"]], names) for f in t["fields"]}
    if typ == "enum":
        names[t["name"]] = t
        names["lathe." + t["name"]] = t
        return j
    if typ == "array":
        return [to_python(t["items"], x, names) for x in j]
    if typ == "map":
        return {k: to_python(t["values"], v, names) for k, v in j.items()}
    raise ValueError(typ)


def cmd_verify(schema_dir, in_path):
    schemas = load_schemas(schema_dir)
    problems, n = [], 0
    with open(in_path, encoding="utf-8") as f:
        for line in f:
            name, version, j, hexmsg = line.rstrip("\n").split("\t")
            js, parsed = schemas[(name, int(version))]
            msg = bytes.fromhex(hexmsg)
            want_fp = fp_bytes(crc64_avro(python_canonical(parsed).encode("utf-8")))
            if msg[:2] != b"\xc3\x01" or msg[2:10] != want_fp:
                problems.append("%s v%s: header %s, expected c301%s" % (name, version, msg[:10].hex(), want_fp.hex()))
                continue
            dec = avro.io.BinaryDecoder(io.BytesIO(msg[10:]))
            got = avro.io.DatumReader(parsed).read(dec)
            want = to_python(js, json.loads(j), {})
            if got != want:
                problems.append("%s v%s: python3-avro read %r, expected %r" % (name, version, got, want))
            n += 1
    for p in problems:
        print("schema_check:", p)
    print("schema_check: python3-avro decoded %d messages, %d problems" % (n, len(problems)))
    return 1 if problems or n == 0 else 0


def cmd_evolve(schema_dir):
    schemas = load_schemas(schema_dir)
    (j1, v1), (j2, v2) = schemas[("StepCompleted", 1)], schemas[("StepCompleted", 2)]
    _, d1 = sample(j1, {}, "s", 1)
    buf = io.BytesIO()
    avro.io.DatumWriter(v1).write(d1, avro.io.BinaryEncoder(buf))
    got = avro.io.DatumReader(v1, v2).read(avro.io.BinaryDecoder(io.BytesIO(buf.getvalue())))
    want = dict(d1, epoch=0.0, grad_norm=None)
    ok = got == want
    _, d2 = sample(j2, {}, "s", 2)
    buf = io.BytesIO()
    avro.io.DatumWriter(v2).write(d2, avro.io.BinaryEncoder(buf))
    got2 = avro.io.DatumReader(v2, v1).read(avro.io.BinaryDecoder(io.BytesIO(buf.getvalue())))
    want2 = {k: v for k, v in d2.items() if k not in ("epoch", "grad_norm")}
    ok2 = got2 == want2
    print("schema_check: v1 data read as v2: %s; v2 data read as v1: %s" % (ok, ok2))
    return 0 if ok and ok2 else 1


def main(argv):
    if len(argv) == 4 and argv[1] == "check":
        return cmd_check(argv[2], argv[3])
    if len(argv) == 4 and argv[1] == "samples":
        return cmd_samples(argv[2], argv[3])
    if len(argv) == 4 and argv[1] == "verify":
        return cmd_verify(argv[2], argv[3])
    if len(argv) == 3 and argv[1] == "evolve":
        return cmd_evolve(argv[2])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
