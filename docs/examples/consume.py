#!/usr/bin/python3
"""Reads Lathe records from a Kafka topic and prints each as one JSON line (docs/EVENTS.md).

A consumer that knows nothing of Lathe but its schemas: python3-confluent-kafka for Kafka,
python3-avro (Debian's 1.11.1) for Avro, and the .avsc files of Lathe's schemas/ directory.
Every Lathe record is an Avro single-object message:

    C3 01 | 8-byte little-endian CRC-64-AVRO fingerprint of the writer schema | Avro binary body

so the fingerprint picks the writer schema and the body decodes with it. The one trap:
python3-avro 1.11.1 computes the Parsing Canonical Form of a primitive that carries a
logicalType (Lathe's `occurred_at` is {"type": "long", "logicalType": "timestamp-millis"}) as
{"type":"long"} where the Avro specification, Java and avro-c write "long". Its fingerprints of
Lathe's schemas therefore match nothing on the wire. This file computes the canonical form from
the specification itself (canonical_form below) and never asks python3-avro for one.

The ce_type and ce_dataschema headers (CloudEvents) name the record and schema version too, so
a consumer may also pick schemas by header; but records written before Lathe added headers, or
by an upstream producer, have none, and the fingerprint is always there.

usage: consume.py --schemas DIR --topic TOPIC [--config FILE] [--bootstrap HOST:PORT]
                  [--group ID] [--max N] [--timeout S]
  --config FILE   librdkafka properties (name=value lines), e.g. SASL settings
  --max N         stop after N records (default: run until --timeout seconds pass without one)
Prints {"topic", "partition", "offset", "key", "type", "version", "fingerprint", "headers",
"record"} per record; a record it cannot decode gives {"topic", "partition", "offset", "error"}.
"""
import argparse
import datetime
import glob
import io
import json
import os
import struct
import sys

import avro.errors
import avro.io
import avro.schema
from confluent_kafka import Consumer

# ---- the Avro specification's fingerprint, independent of python3-avro ----

_EMPTY = 0xC15D213AA4D7A795
_TABLE = []
for _i in range(256):
    _fp = _i
    for _ in range(8):
        _fp = (_fp >> 1) ^ (_EMPTY & -(_fp & 1))
    _TABLE.append(_fp)


def crc64_avro(data):
    fp = _EMPTY
    for b in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ b) & 0xFF]
    return fp


_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def canonical_form(schema, namespace="", seen=None):
    """Parsing Canonical Form of a schema given as parsed JSON, by the specification's rules:
    [PRIMITIVES] a primitive in any form becomes its name (this is where python3-avro 1.11.1
    departs when a logicalType is present), [FULLNAMES], [STRIP] to name, type, fields, symbols,
    items, values and size in that [ORDER], and no whitespace. A named type written a second
    time is its full name."""
    seen = set() if seen is None else seen
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return json.dumps(schema)
        full = schema if "." in schema or not namespace else namespace + "." + schema
        return json.dumps(full)
    if isinstance(schema, list):
        return "[" + ",".join(canonical_form(s, namespace, seen) for s in schema) + "]"
    t = schema["type"]
    if t in _PRIMITIVES:
        return json.dumps(t)
    if t in ("record", "error", "enum", "fixed"):
        name = schema["name"]
        ns = schema.get("namespace", namespace)
        full = name if "." in name or not ns else ns + "." + name
        if full in seen:
            return json.dumps(full)
        seen.add(full)
        ns = full.rsplit(".", 1)[0] if "." in full else ""
        parts = ['"name":' + json.dumps(full), '"type":' + json.dumps(t)]
        if t in ("record", "error"):
            fields = ",".join('{"name":%s,"type":%s}' % (json.dumps(f["name"]),
                                                         canonical_form(f["type"], ns, seen))
                              for f in schema["fields"])
            parts.append('"fields":[' + fields + "]")
        elif t == "enum":
            parts.append('"symbols":' + json.dumps(schema["symbols"], separators=(",", ":")))
        else:
            parts.append('"size":%d' % int(schema["size"]))
        return "{" + ",".join(parts) + "}"
    if t == "array":
        return '{"type":"array","items":%s}' % canonical_form(schema["items"], namespace, seen)
    if t == "map":
        return '{"type":"map","values":%s}' % canonical_form(schema["values"], namespace, seen)
    return canonical_form(t, namespace, seen)  # {"type": "SomeNamedType"}


# The specification's own test value: the fingerprint of "int" is 8f5c393f1ad57572 in wire order.
assert struct.pack("<Q", crc64_avro(canonical_form("int").encode())).hex() == "8f5c393f1ad57572"


def load_schemas(directory):
    """fingerprint (the 8 wire bytes) -> (record name, version, python3-avro schema)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.avsc"))):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        js = json.loads(text)
        fp = struct.pack("<Q", crc64_avro(canonical_form(js).encode()))
        version = int(os.path.basename(path).rsplit(".v", 1)[1].split(".")[0])
        out[fp] = (js["name"], version, avro.schema.parse(text))
    return out


EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def plain(v):
    """A decoded datum as JSON: timestamp-millis back to integer ms, bytes as hex."""
    if isinstance(v, datetime.datetime):
        return (v - EPOCH) // datetime.timedelta(milliseconds=1)
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def decode(schemas, value):
    """(name, version, fingerprint hex, record) of one single-object message, or ValueError."""
    if value is None or len(value) < 10 or value[:2] != b"\xc3\x01":
        raise ValueError("not an Avro single-object message (no C3 01 header)")
    fp = value[2:10]
    if fp not in schemas:
        raise ValueError(f"unknown schema fingerprint {fp.hex()}")
    name, version, schema = schemas[fp]
    body = io.BytesIO(value[10:])
    record = avro.io.DatumReader(schema).read(avro.io.BinaryDecoder(body))
    if body.tell() != len(value) - 10:
        raise ValueError("trailing bytes after the record")
    return name, version, fp.hex(), plain(record)


def read_properties(path):
    conf = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                conf[k.strip()] = v.strip()
    return conf


def main():
    ap = argparse.ArgumentParser(description="Print Lathe records of a Kafka topic as JSON lines.")
    ap.add_argument("--schemas", required=True, help="Lathe's schemas/ directory")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--config", help="librdkafka properties file (SASL, TLS)")
    ap.add_argument("--bootstrap", default=os.environ.get("LATHE_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    ap.add_argument("--group", default=f"lathe-consume-example-{os.getpid()}")
    ap.add_argument("--max", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=10.0)
    args = ap.parse_args()

    schemas = load_schemas(args.schemas)
    conf = {"bootstrap.servers": args.bootstrap}
    if args.config:
        conf.update(read_properties(args.config))
    # Lathe writes some topics in transactions: read only what was committed.
    conf.update({"group.id": args.group, "auto.offset.reset": "earliest",
                 "isolation.level": "read_committed", "enable.auto.commit": False})
    c = Consumer(conf)
    c.subscribe([args.topic])
    n, idle = 0, 0.0
    try:
        while (args.max == 0 or n < args.max) and idle < args.timeout:
            m = c.poll(0.5)
            if m is None:
                idle += 0.5
                continue
            if m.error():
                e = m.error()
                print(f"consume.py: {e.str()}", file=sys.stderr, flush=True)
                if e.fatal() or "AUTHORIZATION" in e.name():  # retrying cannot help
                    return 1
                continue
            idle = 0.0
            n += 1
            where = {"topic": m.topic(), "partition": m.partition(), "offset": m.offset()}
            try:
                name, version, fp, record = decode(schemas, m.value())
            except (ValueError, EOFError, struct.error, avro.errors.AvroException) as e:
                print(json.dumps(dict(where, error=str(e))), flush=True)
                continue
            headers = {k: v.decode("utf-8", "replace") for k, v in (m.headers() or [])}
            key = m.key().decode("utf-8", "replace") if m.key() is not None else None
            print(json.dumps(dict(where, key=key, type=name, version=version, fingerprint=fp,
                                  headers=headers, record=record)), flush=True)
    finally:
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
