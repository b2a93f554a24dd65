"""lt_test: what the Python tests share (the C tests' counterpart is lt_test.h): the stack's
environment, and the client libraries they need with the message that says how to get them."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

BOOTSTRAP = os.environ.get("LATHE_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
ROOT = os.environ.get("LATHE_SOURCE_ROOT", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def require_clients(name):
    """Exits, saying what to install, unless python3-avro and python3-confluent-kafka import."""
    try:
        import avro.io  # noqa: F401
        import confluent_kafka  # noqa: F401
    except ImportError as e:  # pragma: no cover
        sys.exit(f"{name}: {e}: run with /usr/bin/python3 after ops/setup (python3-avro, python3-confluent-kafka)")


def kafka_conf(role="admin", **extra):
    """librdkafka properties for a client of BOOTSTRAP as role's principal: the stack's
    LATHE_KAFKA_CONFIG_DIR/ROLE.properties (`ops/stack env`; docs/DESIGN.md §5a), then extra
    (keyword names with '_' for '.')."""
    conf = {"bootstrap.servers": BOOTSTRAP}
    d = os.environ.get("LATHE_KAFKA_CONFIG_DIR")
    if d:
        with open(os.path.join(d, role + ".properties")) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    k, v = line.split("=", 1)
                    conf[k.strip()] = v.strip()
    conf.update({k.replace("_", "."): v for k, v in extra.items()})
    return conf


def admin_topics(lathe, prefix, fail):
    """`lathe admin topics` under prefix: the roles' ACLs and Lathe's topics, which also lets the
    admin principal make more topics under prefix."""
    import subprocess
    env = dict(os.environ, LATHE_KAFKA_BOOTSTRAP=BOOTSTRAP, LATHE_TOPIC_PREFIX=prefix)
    p = subprocess.run([lathe, "admin", "topics"], env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"lathe admin topics (prefix {prefix}) exited {p.returncode}: {p.stderr}")


def admin_client(fail):
    """A confluent_kafka AdminClient of BOOTSTRAP (the admin principal) once the broker answers;
    else fail(message)."""
    from confluent_kafka.admin import AdminClient
    admin = AdminClient(kafka_conf())
    try:
        admin.list_topics(timeout=10)
    except Exception as e:
        fail(f"Kafka broker at {BOOTSTRAP} is not reachable ({e}): run `ops/stack up` and "
             "`eval \"$(ops/stack env)\"`")
    return admin


def _fail(msg):
    raise SystemExit(f"FAIL: {msg}")


class Child:
    """A lathed child whose stderr is collected by a thread (for "leading" and the port)."""

    def __init__(self, name, argv, env, tag="test"):
        self.name = name
        self.tag = tag
        self.lines = []
        self.cv = threading.Condition()
        self.p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, errors="replace")
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stderr:
            with self.cv:
                self.lines.append(line.rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    def wait_for(self, pattern, timeout):
        rx = re.compile(pattern)
        deadline = time.time() + timeout
        with self.cv:
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m:
                        return m
                if self.p.poll() is not None and not self.t.is_alive():
                    _fail(f"{self.name} exited {self.p.returncode} before printing /{pattern}/")
                left = deadline - time.time()
                if left <= 0:
                    _fail(f"{self.name} did not print /{pattern}/ within {timeout} s")
                self.cv.wait(min(left, 0.5))

    def text(self):
        with self.cv:
            return "\n".join(self.lines)

    def stop(self):
        """Stops it; its exit status (negative: the signal that ended it)."""
        if self.p.poll() is None:  # SIGINT: a worker stops now (SIGTERM would drain it first)
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self.t.join(5)
        return self.p.returncode

    def stopped_clean(self):
        """Stops it: True when it exited 0 and printed no sanitizer report (in a sanitizer build a
        leak found at its exit, or an error, is reported on stderr and changes its status)."""
        code = self.stop()
        return code == 0 and not re.search(r"ERROR: \w+Sanitizer|SUMMARY: \w+Sanitizer|runtime error:", self.text())

    def dump(self):
        tail = self.lines[-40:]
        print(f"{self.tag}: --- {self.name} stderr (last {len(tail)} lines) ---", file=sys.stderr)
        for line in tail:
            print(f"  {line}", file=sys.stderr)


def run(argv, env, what):
    """Runs a command to its end; its stdout, or SystemExit naming what failed."""
    import subprocess
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        _fail(f"{what} exited {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def delete_topics(admin, prefix):
    """Deletes every topic under prefix (a test's scratch topics), ignoring what is already gone."""
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    for f in (admin.delete_topics(names).values() if names else []):
        try:
            f.result(timeout=30)
        except Exception:
            pass


class Checks:
    """A test's named checks: check() prints "TAG: ok: WHAT" or exits with "TAG: FAIL: WHAT"."""

    def __init__(self, tag):
        self.tag = tag
        self.passed = []

    def fail(self, msg):
        raise SystemExit(f"{self.tag}: FAIL: {msg}")

    def check(self, cond, what):
        if not cond:
            self.fail(what)
        self.passed.append(what)
        print(f"{self.tag}: ok: {what}")

    def summary(self):
        print(f"{self.tag}: {len(self.passed)} checks passed")


def tiny_model(lathe, env):
    """The models directory (LATHE_E2E_CACHE) with the bundled lathe-tiny made in it (once)."""
    cache = os.environ.get("LATHE_E2E_CACHE") or "/tmp/lathe-e2e-models"
    run([lathe, "model", "make", "--steps", "20", "--threads", "2", "--out", os.path.join(cache, "lathe-tiny")], env,
        "lathe model make")
    return cache


def task_file(models, out, lines=200):
    """The first `lines` examples of lathe-tiny's task training set, written to out; returns out."""
    with open(os.path.join(models, "lathe-tiny", "task_train.jsonl")) as f, open(out, "w") as o:
        o.writelines(line for i, line in enumerate(f) if i < lines)
    return out
