#!/usr/bin/python3
"""`lathe admin queue` and the scheduler's operator endpoint against the real stack (broker and
object store): `lathed --role api` and `lathed --role scheduler --scheduler-port 0`, and a
worker that exists only as a heartbeat record (4 slots, no model loaded), so that dispatched
jobs hold its slots without running (a second, draining, heartbeat lists the base model, which
the API wants some worker to serve).

  1. tenant A submits two standard 1-GPU jobs and tenant B a preemptible one: all three are
     dispatched (3 of 4 slots), the first one a cold load;
  2. B submits a standard 2-GPU job: it waits, and the one free slot is fragmented;
  3. `lathe admin queue --json` says so per tenant and class (queued, running slots, share 1.0
     against entitlement 0.5 for A's standard work, GPU-hours > 0, cold loads) and for the fleet
     (slots 3/4, fragmented 1, smallest queued 2, Jain's index 0.5 for standard); the table
     names both tenants; /metrics has the histograms and the fleet gauges.

usage: admin_queue_python.py PATH/TO/lathe PATH/TO/lathed
Environment: the stack's (`ops/stack env`). Exits non-zero with a message on any failure."""
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import lt_test
from lt_test import BOOTSTRAP, ROOT, Child, admin_client, run

CHECKS = []


def fail(msg):
    raise SystemExit(f"admin_queue: FAIL: {msg}")


def check(cond, what):
    if not cond:
        fail(what)
    CHECKS.append(what)
    print(f"admin_queue: ok: {what}", flush=True)


def heartbeat(lathe, env, worker, seq, models=(), draining=False):
    rec = {"event_id": str(uuid.uuid4()), "occurred_at": int(time.time() * 1000), "producer": f"worker/{worker}",
           "worker_id": worker, "seq": seq, "backend": "cpu", "slots_total": 4, "slots_free": 4,
           "memory_total_bytes": 4 << 30, "memory_free_bytes": 4 << 30, "base_models": list(models),
           "owned_partitions": [], "leases": [], "draining": draining}
    p = subprocess.run([lathe, "topic", "produce", "workers", "WorkerHeartbeat"], env=env, input=json.dumps(rec) + "\n",
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        fail(f"lathe topic produce workers WorkerHeartbeat exited {p.returncode}: {p.stderr.strip()}")


def wait_ready(healthz, timeout=90):
    """Until the API has read the log (/healthz answers 200 rather than 503 "starting")."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(healthz, timeout=10) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    fail(f"the API was not ready within {timeout} s ({healthz})")


def queue(lathe, env, url):
    return json.loads(run([lathe, "admin", "queue", "--url", url, "--json"], env, "lathe admin queue --json"))


def wait_queue(lathe, env, url, cond, what, timeout=60):
    deadline, q = time.time() + timeout, None
    while time.time() < deadline:
        q = queue(lathe, env, url)
        if cond(q):
            return q
        time.sleep(0.3)
    fail(f"{what} within {timeout} s; last answer: {json.dumps(q)}")


def row(q, tenant, cls):
    for r in q["rows"]:
        if r["tenant"] == tenant and r["class"] == cls:
            return r
    fail(f"no row for {tenant} {cls} in {json.dumps(q['rows'])}")


def submit(lathe, env, key, ds, *sets):
    """Submits a job; retried while the API has not yet folded the heartbeat that lists the model
    (the two heartbeats are keyed apart, so they may be folded in either order)."""
    args = [lathe, "jobs", "submit", "--model", "lathe-tiny", "--dataset", ds, "--json"]
    for s in sets:
        args += ["--set", s] if "=" in s else ["--priority", s]
    deadline = time.time() + 30
    while True:
        p = subprocess.run(args, env=dict(env, LATHE_API_KEY=key), capture_output=True, text=True, timeout=60)
        if p.returncode == 0:
            return json.loads(p.stdout)["id"]
        if "is not served here" not in p.stderr or time.time() > deadline:
            fail(f"lathe jobs submit exited {p.returncode}: {p.stderr.strip()}")
        time.sleep(0.3)


def scenario(lathe, env, api_url, url, ta, tb, keys, tmp):
    # the API accepts a base model some worker's heartbeat lists: a draining one lists it (the
    # scheduler places nothing there), the one that takes the jobs holds no model
    heartbeat(lathe, env, "fakew0", 1, models=["lathe-tiny"], draining=True)
    heartbeat(lathe, env, "fakew1", 1)
    wait_queue(lathe, env, url, lambda q: q["fleet"]["slots_total"] == 4, "the heartbeat's worker is up (4 slots)")
    path = os.path.join(tmp, "d.jsonl")
    with open(path, "w") as f:
        for i in range(8):
            f.write(json.dumps({"prompt": f"q{i}:", "completion": f" a{i}"}) + "\n")
    ds = {}
    for t in (ta, tb):
        e = dict(env, LATHE_API_KEY=keys[t])
        up = run([lathe, "datasets", "upload", path, "--name", "d", "--json"], e, "datasets upload")
        ds[t] = json.loads(up)["id"]
    submit(lathe, env, keys[ta], ds[ta], "standard")
    submit(lathe, env, keys[ta], ds[ta], "standard")
    submit(lathe, env, keys[tb], ds[tb], "preemptible")
    q = wait_queue(lathe, env, url, lambda q: q["fleet"]["slots_used"] == 3, "three 1-GPU jobs hold 3 slots")
    submit(lathe, env, keys[tb], ds[tb], "standard", "gpus=2")
    q = wait_queue(lathe, env, url, lambda q: q["fleet"]["queued"] == 1, "B's 2-GPU job is queued")
    a, bp, bs = row(q, ta, "standard"), row(q, tb, "preemptible"), row(q, tb, "standard")
    check(a["queued"] == 0 and a["running_slots"] == 2 and a["dispatched"] == 2, f"A standard: 2 running slots ({a})")
    check(bp["queued"] == 0 and bp["running_slots"] == 1, f"B preemptible: 1 running slot ({bp})")
    check(bs["queued"] == 1 and bs["running_slots"] == 0, f"B standard: 1 queued ({bs})")
    check(abs(a["share"] - 1.0) < 1e-9 and abs(a["entitlement"] - 0.5) < 1e-9,
          "A holds all of standard's slots against an entitlement of half")
    check(abs(q["jain"]["standard"] - 0.5) < 1e-9, f"Jain's index of standard is 0.5 ({q['jain']})")
    check(a["gpu_hours"] > 0 and bs["gpu_hours"] == 0, "A's running jobs accrue GPU-hours, B's queued one none")
    check(a["cold_loads"] == 1 and bp["cold_loads"] == 0 and q["fleet"]["cold_loads"] == 1,
          "one cold load: the first job's model, then the worker holds it")
    f = q["fleet"]
    check(f["slots_used"] == 3 and f["slots_total"] == 4 and f["workers"] == 1, f"fleet slots 3/4 ({f})")
    check(f["fragmented_slots"] == 1 and f["smallest_queued_gpus"] == 2,
          "the one free slot cannot host the smallest queued job (2 GPUs): fragmented")
    check(f["reserved_idle_slots"] == 0 and f["reserved_idle_slot_hours"] == 0, "nothing reserved yet")
    text = run([lathe, "admin", "queue", "--url", url], env, "lathe admin queue")
    lines = text.splitlines()
    check(any(re.match(rf"{ta}\s+standard\s+0\s+2\s", x) for x in lines) and
          any(re.match(rf"{tb}\s+standard\s+1\s+0\s", x) for x in lines) and
          any(re.match(r"fragmented slots\s+1$", x) for x in lines), f"the table names both tenants:\n{text}")
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        m = r.read().decode()
    for want in ("lathe_scheduler_leading 1",
                 f'lathe_wait_seconds_count{{class="standard",tenant="{ta}"}} 2',
                 f'lathe_wait_seconds_bucket{{class="standard",tenant="{ta}",le="+Inf"}} 2',
                 f'lathe_sched_queued{{class="standard",tenant="{tb}"}} 1',
                 f'lathe_cold_loads_total{{class="standard",tenant="{ta}"}} 1',
                 "lathe_fragmented_slots 1", "lathe_reserved_idle_slot_seconds_total 0",
                 'lathe_slots{state="used"} 3'):
        check(want in m, f"/metrics has {want}")
    check(re.search(rf'lathe_tenant_gpu_seconds_total{{class="standard",tenant="{ta}"}} [0-9.e+-]+', m) is not None,
          "/metrics has A's GPU-seconds")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: admin_queue_python.py PATH/TO/lathe PATH/TO/lathed")
    lathe, lathed = sys.argv[1], sys.argv[2]
    admin = admin_client(fail)
    run_id = f"{os.getpid()}{secrets.token_hex(3)}"
    prefix = f"tq{run_id}."
    env = dict(os.environ, LATHE_KAFKA_BOOTSTRAP=BOOTSTRAP, LATHE_TOPIC_PREFIX=prefix, LATHE_SOURCE_ROOT=ROOT,
               LATHE_API_KEY_RATE="off", LATHE_API_TENANT_RATE="off")
    tmp = tempfile.mkdtemp(prefix="lathe-queue-")
    kids = []
    try:
        run([lathe, "admin", "topics"], env, "lathe admin topics")
        ta, tb = f"qa{run_id}", f"qb{run_id}"
        keys = {t: json.loads(run([lathe, "admin", "tenant", "create", t, "--json"], env, "tenant create"))["api_key"]
                for t in (ta, tb)}
        api = Child("api", [lathed, "--role", "api", "--port", "0", "--operator-port", "0"],
                    dict(env, LATHE_INSTANCE="qapi"))
        # long leases: the heartbeat worker never renews, and its jobs never start
        sched = Child("scheduler", [lathed, "--role", "scheduler", "--scheduler-port", "0"],
                      dict(env, LATHE_INSTANCE="qsched", LATHE_LEASE_MS="600000", LATHE_START_TIMEOUT_MS="600000"))
        kids += [api, sched]
        port = int(api.wait_for(r"listening on http://127\.0\.0\.1:(\d+)", 90).group(1))
        ops = int(api.wait_for(r"api operator endpoints .* at http://127\.0\.0\.1:(\d+)", 90).group(1))
        sport = int(sched.wait_for(r"scheduler operator endpoints .* at http://127\.0\.0\.1:(\d+)", 90).group(1))
        sched.wait_for(r"scheduler: leading \(", 90)
        api_url, url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{sport}"
        wait_ready(f"http://127.0.0.1:{ops}/healthz")
        env["LATHE_API_URL"] = api_url
        try:
            scenario(lathe, env, api_url, url, ta, tb, keys, tmp)
        except BaseException:
            for k in kids:
                k.dump()
            raise
        bad = subprocess.run([lathe, "admin", "queue", "--url", "http://127.0.0.1:9"], env=env, capture_output=True,
                             text=True, timeout=60)
        check(bad.returncode != 0 and "--scheduler-port" in bad.stderr,
              f"no scheduler endpoint: an error that says how to serve one ({bad.stderr.strip()})")
    finally:
        for k in kids:
            k.stop()
        lt_test.delete_topics(admin, prefix)
        subprocess.run(["rm", "-rf", tmp])
    print(f"admin_queue: {len(CHECKS)} checks passed")


if __name__ == "__main__":
    main()
