"""Avro specification pieces the Python tests share, written from the specification and
independent of Lathe's C code: CRC-64-AVRO ("Schema Fingerprints") and the Parsing Canonical Form
as python3-avro computes it, with python3-avro 1.11.1's one departure from the specification
undone.

Imported by tests/schema_check.py, tests/interop_kafka.py and tests/upstream_python.py (Python
puts a script's own folder first on sys.path)."""

EMPTY = 0xC15D213AA4D7A795
_TABLE = []
for _i in range(256):
    _fp = _i
    for _ in range(8):
        _fp = (_fp >> 1) ^ (EMPTY & -(_fp & 1))
    _TABLE.append(_fp)


def crc64_avro(data: bytes) -> int:
    fp = EMPTY
    for b in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ b) & 0xFF]
    return fp


def fp_bytes(fp: int) -> bytes:
    """The 8 header bytes of a fingerprint (little-endian, as single-object encoding writes them)."""
    return fp.to_bytes(8, "little")


# The specification's own test value: the fingerprint of "int".
assert fp_bytes(crc64_avro(b'"int"')) == bytes([0x8F, 0x5C, 0x39, 0x3F, 0x1A, 0xD5, 0x75, 0x72])

PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")


def canonical_form(schema) -> str:
    """python3-avro's canonical_form, with its one known departure from the specification undone.

    python3-avro 1.11.1 writes a primitive that carries a logicalType as {"type":"long"}; the
    specification's [PRIMITIVES] rule (and Java's SchemaNormalization, which defines the
    fingerprints other languages must agree with) reduce it to "long". Nothing else is touched:
    the replacement only matches that exact object form."""
    form = schema.canonical_form
    for p in PRIMITIVES:
        form = form.replace('{"type":"%s"}' % p, '"%s"' % p)
    return form
