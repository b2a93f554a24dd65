"""lt_test: what the Python tests share (the C tests' counterpart is lt_test.h): the stack's
environment, and the client libraries they need with the message that says how to get them."""
import os
import sys

BOOTSTRAP = os.environ.get("LATHE_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
ROOT = os.environ.get("LATHE_SOURCE_ROOT", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def require_clients(name):
    """Exits, saying what to install, unless python3-avro and python3-confluent-kafka import."""
    try:
        import avro.io  # noqa: F401
        import confluent_kafka  # noqa: F401
    except ImportError as e:  # pragma: no cover
        sys.exit(f"{name}: {e}: run with /usr/bin/python3 after ops/setup (python3-avro, python3-confluent-kafka)")


def admin_client(fail):
    """A confluent_kafka AdminClient of BOOTSTRAP once the broker answers; else fail(message)."""
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    try:
        admin.list_topics(timeout=10)
    except Exception as e:
        fail(f"Kafka broker at {BOOTSTRAP} is not reachable ({e}): run `ops/stack up` and "
             "`eval \"$(ops/stack env)\"`")
    return admin
