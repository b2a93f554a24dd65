#!/usr/bin/python3
"""Operations that fit the ecosystem (docs/DESIGN.md §9 "Operations"): every role's /metrics
passes `promtool check metrics`, and `--log-format json` makes every stderr line a JSON object.

Against the real stack (Kafka broker, object store), each role in a process of its own, all with
--log-format json: api, scheduler, publisher, worker (confined executors, the tiny base model) and
sampler. A small fine-tune runs through so that the job families have samples (waits, a published
artifact, an executor's outcome, uploaded bytes) and one completion goes through the sampler. Then:

  1. each role's operator port answers /healthz, and its /metrics, piped into
     `promtool check metrics`, exits 0 and prints no problem (promtool lints names, units, HELP
     and TYPE, and histograms);
  2. the figures that say the flow happened are there (a 2xx submission counted once answered,
     the job's wait in a histogram, an executor ended "completed", an artifact published);
  3. every stderr line of every role parses as JSON with ts, level, role, instance and msg
     (`jq -e` as well), lines about a job carry it as a field, and no line holds a prompt;
  4. `lathe admin drain` from here: a worker that never ran is refused by name; a drain request
     without the master key's signature (written with `lathe topic produce`) is ignored; the
     signed one makes the worker's heartbeat say draining and the worker-only process exit 0; a
     second drain says it drains already; the worker started again under the same id is not
     drained by the old request (it runs the next job).

usage: operations_python.py PATH/TO/lathe PATH/TO/lathed
promtool (Debian package prometheus) and jq are required: ops/setup installs both."""
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import lt_test
from lt_test import BOOTSTRAP, ROOT, Child, admin_client, run

CHECKS = []


def fail(msg):
    raise SystemExit(f"operations: FAIL: {msg}")


def check(cond, what):
    if not cond:
        fail(what)
    CHECKS.append(what)
    print(f"operations: ok: {what}", flush=True)


def get(url, key=None, body=None, timeout=60):
    """(status, bytes) of a GET, or of a POST of body (JSON) when given."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def model_dir(lathe, env):
    cache = os.environ.get("LATHE_E2E_CACHE") or "/tmp/lathe-e2e-models"
    run([lathe, "model", "make", "--steps", "20", "--threads", "2", "--out", os.path.join(cache, "lathe-tiny")], env,
        "lathe model make")
    return cache


def submit(lathe, env, key, tmp):
    """A short managed fine-tune of the tiny model; its job id."""
    src = os.path.join(env["LATHE_MODELS_DIR"], "lathe-tiny", "task_train.jsonl")
    path = os.path.join(tmp, "ops.jsonl")
    with open(src) as f, open(path, "w") as o:
        for i, line in enumerate(f):
            if i >= 64:
                break
            o.write(line)
    e = dict(env, LATHE_API_KEY=key)
    ds = json.loads(run([lathe, "datasets", "upload", path, "--name", "ops", "--json"], e, "datasets upload"))["id"]
    return json.loads(run([lathe, "jobs", "submit", "--model", "lathe-tiny", "--dataset", ds, "--set", "max_steps=4",
                           "--set", "batch_size=4", "--set", "lora_rank=4", "--set", "seed=3", "--json"], e,
                          "jobs submit"))["id"]


def wait_published(base, key, job, timeout=600):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, body = get(f"{base}/v1/jobs/{job}/artifacts", key)
        doc = json.loads(body) if body[:1] == b"{" else {}
        if st == 200 and any(a["name"] == "adapter_model.safetensors" for a in doc.get("artifacts", [])):
            return
        st, body = get(f"{base}/v1/jobs/{job}", key)
        if st == 200 and json.loads(body).get("state") in ("failed", "cancelled"):
            fail(f"job {job} ended {json.loads(body).get('state')}: {body[:400]!r}")
        time.sleep(1)
    fail(f"job {job} was not published within {timeout} s")


def value(text, sample):
    """The value of the sample line that starts with sample (name and labels), or None."""
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return None


def promtool_clean(promtool, role, text):
    p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    said = (p.stdout + p.stderr).strip()
    if p.returncode != 0 or said:
        print(f"operations: --- {role} /metrics ---\n{text}", file=sys.stderr)
    check(p.returncode == 0 and not said, f"{role}: promtool check metrics passes with nothing to say ({said[:600]})")


def scrape(ops, role, promtool):
    st, body = get(f"{ops}/healthz")
    check(st == 200 and json.loads(body), f"{role}: /healthz answers 200 with JSON on the operator port")
    st, body = get(f"{ops}/metrics")
    check(st == 200, f"{role}: /metrics answers 200")
    text = body.decode()
    promtool_clean(promtool, role, text)
    return text


def wait_value(ops, sample, want, timeout=60):
    """The scrape once sample reaches at least want (the roles fold asynchronously)."""
    deadline, text = time.time() + timeout, ""
    while time.time() < deadline:
        text = get(f"{ops}/metrics")[1].decode()
        v = value(text, sample)
        if v is not None and v >= want:
            return text
        time.sleep(0.5)
    fail(f"{sample} did not reach {want} within {timeout} s:\n{text}")


def logs_are_json(children, jq, secret, job):
    lines = [(c.name, line) for c in children for line in c.text().splitlines()]
    check(len(lines) > 10, f"the roles logged ({len(lines)} lines)")
    bad = []
    objs = []
    for name, line in lines:
        try:
            o = json.loads(line)
        except ValueError:
            bad.append(f"{name}: {line}")
            continue
        if not isinstance(o, dict) or not all(k in o for k in ("ts", "level", "role", "instance", "msg")):
            bad.append(f"{name}: {line}")
        objs.append(o)
    check(not bad, "every stderr line of every role is a JSON object with ts, level, role, instance, msg"
          + ("" if not bad else ": " + "\n".join(bad[:10])))
    ts = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
    check(all(ts.match(o["ts"]) for o in objs), "ts is RFC 3339 UTC with milliseconds")
    check({o["level"] for o in objs} <= {"debug", "info", "warn", "error"}, "levels are debug, info, warn, error")
    check({o["role"] for o in objs} >= {"api", "scheduler", "publisher", "worker", "sampler"},
          f"each role names itself ({sorted({o['role'] for o in objs})})")
    about = [o for o in objs if o.get("job") == job]
    check(any(o["role"] == "worker" and o.get("attempt") == 1 for o in about),
          "the worker's lines about the job carry job and attempt as fields")
    check(any(o["role"] == "publisher" for o in about), "the publisher's lines about the job carry it as a field")
    text = "\n".join(line for _, line in lines) + "\n"
    p = subprocess.run([jq, "-e", "-s", "all(.ts and .level)"], input=text, capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"jq -e '.ts and .level' holds for every line ({p.stderr.strip()[:300]})")
    check(secret not in text, "no log line holds the prompt a customer sent")


def drain(lathe, env, wrk, wid, start, base, key, tmp):
    """Section 4. wrk: the worker-only child, whose id is wid; start(role): another child of that role."""
    p = subprocess.run([lathe, "admin", "drain", "no-such-worker", "--wait", "0"], env=env, capture_output=True,
                       text=True, timeout=120)
    check(p.returncode == 1 and "no worker \"no-such-worker\"" in p.stderr and wid in p.stderr,
          f"drain of an unknown worker: refused, naming the known ones ({p.stderr.strip()})")
    tail = subprocess.run([lathe, "topic", "tail", "workers", "--max", "1", "--timeout-ms", "30000"], env=env,
                          capture_output=True, text=True, timeout=120, check=True)  # the next heartbeat: this run's
    beat = json.loads(tail.stdout.splitlines()[0])["record"]
    check(beat["worker_id"] == wid, f"the only worker's heartbeat, read back ({beat['worker_id']})")
    beat = beat["event_id"]
    forged = {"event_id": secrets.token_hex(16), "occurred_at": int(time.time() * 1000),
              "producer": "admin/forger", "worker_id": wid, "heartbeat_event_id": beat, "reason": "forged"}
    subprocess.run([lathe, "topic", "produce", "control", "WorkerDrainRequested"], env=env,
                   input=json.dumps(forged) + "\n", capture_output=True, text=True, timeout=120, check=True)
    wrk.wait_for(r"drain request for this worker at control/\d+@\d+ is not signed with the master key: ignored", 60)
    time.sleep(2)
    check(wrk.p.poll() is None, "a drain request without the master key's signature is ignored: the worker runs on")
    p = subprocess.run([lathe, "admin", "drain", wid, "--reason", "kernel upgrade", "--wait", "60"], env=env,
                       capture_output=True, text=True, timeout=180)
    check(p.returncode == 0 and "drains: its heartbeat says so" in p.stdout,
          f"lathe admin drain {wid}: its heartbeat says draining ({p.stdout.strip()} {p.stderr.strip()})")
    try:
        rc = wrk.p.wait(90)
    except subprocess.TimeoutExpired:
        rc = None
    check(rc == 0, f"the drained worker-only process exited 0 ({rc})")
    wrk.wait_for(r"an operator asks this worker to drain: kernel upgrade", 5)
    p = subprocess.run([lathe, "admin", "drain", wid, "--wait", "0"], env=env, capture_output=True, text=True,
                       timeout=120)
    check(p.returncode == 0 and "drains already" in p.stdout, f"a second drain: {p.stdout.strip()}")
    again = start("worker", "--operator-port", "0")
    again.wait_for(r"worker operator endpoints", 90)
    job = submit(lathe, dict(env, LATHE_API_URL=base), key, tmp)
    wait_published(base, key, job)
    check(again.p.poll() is None and "asks this worker to drain" not in again.text(),
          "the worker started again under the same id ignores the old request and runs the next job")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: operations_python.py PATH/TO/lathe PATH/TO/lathed")
    lathe, lathed = sys.argv[1], sys.argv[2]
    promtool, jq = shutil.which("promtool"), shutil.which("jq")
    if not promtool:
        fail("promtool not installed (ops/setup installs prometheus)")
    if not jq:
        fail("jq not installed (ops/setup installs jq)")
    admin = admin_client(fail)
    run_id = f"{os.getpid()}{secrets.token_hex(3)}"
    prefix = f"tops{run_id}."
    env = dict(os.environ, LATHE_KAFKA_BOOTSTRAP=BOOTSTRAP, LATHE_TOPIC_PREFIX=prefix, LATHE_SOURCE_ROOT=ROOT,
               LATHE_API_KEY_RATE="off", LATHE_API_TENANT_RATE="off")
    env.pop("LATHE_LOG_FORMAT", None)
    tmp = tempfile.mkdtemp(prefix="lathe-ops-")
    env["LATHE_MODELS_DIR"] = model_dir(lathe, env)
    children = []
    try:
        run([lathe, "admin", "topics"], env, "lathe admin topics")
        key = json.loads(run([lathe, "admin", "tenant", "create", f"ops{run_id}", "--json"], env,
                             "tenant create"))["api_key"]

        def start(role, *args):
            c = Child(role, [lathed, "--role", role, "--log-format", "json", *args],
                      dict(env, LATHE_INSTANCE=f"ops{run_id}-{role}"), tag="operations")
            children.append(c)
            return c

        api = start("api", "--port", "0", "--operator-port", "0")
        sched = start("scheduler", "--scheduler-port", "0")
        pub = start("publisher", "--operator-port", "0")
        wrk = start("worker", "--operator-port", "0")
        smp = start("sampler", "--port", "0", "--operator-port", "0")
        port = int(api.wait_for(r"api listening on http://127\.0\.0\.1:(\d+)", 90).group(1))
        ops = {"api": api.wait_for(r"api operator endpoints .* at (http://127\.0\.0\.1:\d+)", 90).group(1),
               "scheduler": sched.wait_for(r"scheduler operator endpoints .* at (http://127\.0\.0\.1:\d+)", 90).group(1),
               "publisher": pub.wait_for(r"publisher operator endpoints .* at (http://127\.0\.0\.1:\d+)", 90).group(1),
               "worker": wrk.wait_for(r"worker operator endpoints .* at (http://127\.0\.0\.1:\d+)", 90).group(1),
               "sampler": smp.wait_for(r"sampler operator endpoints .* at (http://127\.0\.0\.1:\d+)", 120).group(1)}
        sport = int(smp.wait_for(r"sampler listening on http://127\.0\.0\.1:(\d+)", 120).group(1))
        sched.wait_for(r"leading \(", 90)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 120
            while True:  # the API answers 503 "starting" until it has read the log (slower under ASan)
                st, _ = get(f"{base}/v1/jobs", key)
                if st != 503 or time.time() > deadline:
                    break
                time.sleep(0.5)
            check(st == 200, f"api: ready for the tenant ({st})")
            job = submit(lathe, dict(env, LATHE_API_URL=base), key, tmp)
            wait_published(base, key, job)
            secret = "date: zz-ops-secret-" + secrets.token_hex(4)
            deadline = time.time() + 60
            while True:  # the sampler answers 503 until it has read the tenants
                st, body = get(f"http://127.0.0.1:{sport}/v1/completions", key,
                               {"model": "lathe-tiny", "prompt": secret, "max_tokens": 2}, timeout=120)
                if st != 503 or time.time() > deadline:
                    break
                time.sleep(0.5)
            check(st == 200, f"a completion from the base model ({st}: {body[:200]!r})")
            texts = {role: scrape(url, role, promtool) for role, url in ops.items()}
            a = texts["api"]
            check((value(a, 'lathe_api_requests_total{route="jobs",code="2xx"}') or 0) >= 1,
                  "api: the submission is counted 2xx once answered")
            check("lathe_api_request_duration_seconds_bucket{route=\"jobs\",le=\"+Inf\"}" in a,
                  "api: latencies are a histogram in seconds")
            check(re.search(r'lathe_tenant_wait_seconds_count\{tenant="[^"]+",class="[a-z]+"\} 1', a) is not None,
                  "api: the job's queue wait is in lathe_tenant_wait_seconds")
            check(value(texts["scheduler"], "lathe_scheduler_leading") == 1, "scheduler: leading, on /metrics")
            w = wait_value(ops["worker"], 'lathe_worker_attempts_ended_total{outcome="completed"}', 1)
            promtool_clean(promtool, "worker (after the attempt ended)", w)
            check(value(w, 'lathe_worker_slots{state="total"}') == 1, "worker: its slots on /metrics")
            check(value(w, "lathe_worker_executors_started_total") == 1, "worker: one executor started")
            check(value(w, "lathe_worker_draining") == 0, "worker: not draining, on /metrics")
            check((value(w, "lathe_worker_uploaded_bytes_total") or 0) > 0 and
                  (value(w, "lathe_worker_fetched_bytes_total") or 0) > 0, "worker: bytes fetched and uploaded")
            check(0 <= (value(w, "lathe_worker_heartbeat_lag_seconds") or -1) < 30, "worker: heartbeats acknowledged")
            p = wait_value(ops["publisher"], 'lathe_publisher_completions_total{outcome="published"}', 1)
            check((value(p, "lathe_publisher_records_folded_total") or 0) > 0, "publisher: records folded")
            check(value(p, "lathe_publisher_consumer_lag_records") is not None, "publisher: its consumer lag")
            check((value(texts["sampler"], "lathe_sampler_finished_total") or 0) >= 1, "sampler: the completion counted")
            drain(lathe, env, wrk, f"ops{run_id}-worker", start, base, key, tmp)
        except BaseException:
            for c in children:
                c.dump()
            raise
        for c in children:
            c.stop()
        logs_are_json(children, jq, secret, job)
    finally:
        for c in children:
            c.stop()
        lt_test.delete_topics(admin, prefix)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"operations: {len(CHECKS)} checks passed")


if __name__ == "__main__":
    main()
