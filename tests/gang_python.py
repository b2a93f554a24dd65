#!/usr/bin/python3
"""A gang across workers on the real stack (docs/DESIGN.md §6, §7): two workers of one node group,
one CPU slot each (`lathed --role all` holds the first, `lathed --role worker` the second, both
with LATHE_WORKER_NODE_GROUP and their own LATHE_WORKER_RENDEZVOUS), and a managed job asking for
2 GPUs, more than either worker has.

  1. the scheduler places it on both workers (JobDispatched v2: rank 0 and 1, world 2, rank 0's
     rendezvous); each worker joins the gang and hands the connections to its confined executor;
     the two executors train data-parallel (grad_accum 2: one micro-batch each a step) and the
     job completes and is published;
  2. the same job on 1 GPU (one executor accumulating both micro-batches) publishes a
     byte-identical adapter: the gang's rank-ordered sum is what one executor accumulates
     (lora_alpha / lora_rank a power of two, dropout on: the ranks draw one executor's masks);
  3. both workers logged an executor of the gang job, and only rank 0 spoke for it: the job's
     control records name rank 0's worker alone, and the second worker recorded no step;
  4. the second worker again, now with its object store unreachable (a port nothing listens on,
     a 1.5 s retry window): whichever rank it holds stops the gang's attempt as unavailable, the
     other rank, waiting to join, ends at once instead of failing at its join timeout, and with
     the scheduler's bound at 2 the job fails as store_unavailable with no failed attempt.

usage: gang_python.py PATH/TO/lathe PATH/TO/lathed
Environment: the stack's (`ops/stack env`). Exits non-zero with a message on any failure."""
import json
import os
import secrets
import shutil
import signal
import socket
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
    raise SystemExit(f"gang: FAIL: {msg}")


def check(cond, what):
    if not cond:
        fail(what)
    CHECKS.append(what)
    print(f"gang: ok: {what}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(base, key, path):
    req = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_published(base, key, job, timeout=600):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, body = http(base, key, f"/v1/jobs/{job}")
        j = json.loads(body) if st == 200 else {}
        if j.get("state") in ("failed", "cancelled", "rejected"):
            fail(f"job {job} ended {j.get('state')}: {j.get('reason') or j.get('error')}")
        st, body = http(base, key, f"/v1/jobs/{job}/artifacts")
        names = [a["name"] for a in json.loads(body).get("artifacts", [])] if st == 200 else []
        if "adapter_model.safetensors" in names:
            return j
        time.sleep(1)
    fail(f"job {job} was not published within {timeout} s")


def submit(lathe, env, key, ds, gpus, seed, steps=6):
    e = dict(env, LATHE_API_KEY=key)
    sets = [f"max_steps={steps}", "batch_size=4", "grad_accum=2", "lora_rank=4", "lora_alpha=8", "lora_dropout=0.1",
            "learning_rate=0.003", f"seed={seed}", f"gpus={gpus}", "eval_interval=0"]
    args = [lathe, "jobs", "submit", "--model", "lathe-tiny", "--dataset", ds, "--json"]
    for s in sets:
        args += ["--set", s]
    return json.loads(run(args, e, "jobs submit"))["id"]


def control_records(lathe, env, job):
    """The job's records on lathe.control, decoded (`lathe topic tail`)."""
    out = run([lathe, "topic", "tail", "control", "--from-beginning", "--timeout-ms", "3000"], env,
              "lathe topic tail control")
    recs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [r for r in recs if r.get("key") == job]


def wait_partitions(lathe, env, workers, timeout=90):
    """Until both workers' newest heartbeats list dispatch partitions that together cover every
    class topic's partitions (the group settled): a dispatch then reaches the worker named in it,
    not a partition another worker owns (which it would skip, leaving the scheduler's start
    timeout to try again)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        # heartbeats keep coming: read for 4 s, then SIGTERM (tail stops cleanly; `timeout` says 124)
        p = subprocess.run(["timeout", "4", lathe, "topic", "tail", "workers", "--from-beginning"], env=env,
                           capture_output=True, text=True, timeout=60)
        if p.returncode not in (0, 124):
            fail(f"lathe topic tail workers exited {p.returncode}: {p.stderr.strip()}")
        out = p.stdout
        latest = {}
        for line in out.splitlines():
            if line.startswith("{"):
                r = json.loads(line).get("record", {})
                latest[r.get("worker_id")] = r
        owned = [set((p["topic"], p["partition"]) for p in latest.get(w, {}).get("owned_partitions", []))
                 for w in workers]
        if all(owned) and len(owned[0] | owned[1]) == 12 and not owned[0] & owned[1]:
            time.sleep(2)  # the scheduler folds the heartbeats
            return
        time.sleep(1)
    fail(f"the workers' dispatch partitions did not settle within {timeout} s")


def wait_ended(base, key, job, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, body = http(base, key, f"/v1/jobs/{job}")
        j = json.loads(body) if st == 200 else {}
        if j.get("state") in ("completed", "failed", "cancelled", "rejected"):
            return j
        time.sleep(1)
    fail(f"job {job} did not end within {timeout} s")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gang_python.py PATH/TO/lathe PATH/TO/lathed")
    lathe, lathed = sys.argv[1], sys.argv[2]
    admin = admin_client(fail)
    run_id = f"{os.getpid()}{secrets.token_hex(3)}"
    prefix = f"tgang{run_id}."
    env = dict(os.environ, LATHE_KAFKA_BOOTSTRAP=BOOTSTRAP, LATHE_TOPIC_PREFIX=prefix, LATHE_SOURCE_ROOT=ROOT)
    tmp = tempfile.mkdtemp(prefix="lathe-gang-")
    cache = os.environ.get("LATHE_E2E_CACHE") or "/tmp/lathe-e2e-models"
    run([lathe, "model", "make", "--steps", "20", "--threads", "2", "--out", os.path.join(cache, "lathe-tiny")], env,
        "lathe model make")
    env["LATHE_MODELS_DIR"] = cache
    group = dict(LATHE_WORKER_SLOTS="1", LATHE_WORKER_NODE_GROUP=f"rack-{run_id}", LATHE_API_KEY_RATE="off",
                 LATHE_API_TENANT_RATE="off")
    d = w2 = None
    try:
        run([lathe, "admin", "topics"], env, "lathe admin topics")
        out = json.loads(run([lathe, "admin", "tenant", "create", f"gang{run_id}", "--json"], env, "tenant create"))
        key = out["api_key"]
        d = Child("lathed all", [lathed, "--role", "all", "--port", "0", "--operator-port", "0"],
                  dict(env, LATHE_INSTANCE=f"g1{run_id}", LATHE_WORKER_RENDEZVOUS=f"127.0.0.1:{free_port()}",
                       LATHE_MAX_UNAVAILABLE_STOPS="2", **group),
                  tag="gang")
        w2 = Child("lathed worker", [lathed, "--role", "worker"],
                   dict(env, LATHE_INSTANCE=f"g2{run_id}", LATHE_WORKER_RENDEZVOUS=f"127.0.0.1:{free_port()}",
                        **group), tag="gang")
        port = int(d.wait_for(r"api listening on http://127\.0\.0\.1:(\d+)", 120).group(1))
        d.wait_for(r"scheduler: leading \(", 90)
        w2.wait_for(r"worker .* started", 60)
        wait_partitions(lathe, env, [f"g1{run_id}", f"g2{run_id}"])
        base = f"http://127.0.0.1:{port}"
        e = dict(env, LATHE_API_URL=base, LATHE_API_KEY=key)
        src = os.path.join(cache, "lathe-tiny", "task_train.jsonl")
        path = os.path.join(tmp, "d.jsonl")
        with open(src) as f, open(path, "w") as o:
            for i, line in enumerate(f):
                if i >= 120:
                    break
                o.write(line)
        ds = json.loads(run([lathe, "datasets", "upload", path, "--name", "d", "--json"], e, "datasets upload"))["id"]
        try:
            gang = submit(lathe, e, key, ds, 2, 5)
            wait_published(base, key, gang)
            check(True, "a 2-GPU job ran on two 1-slot workers of one node group and was published")
            one = submit(lathe, e, key, ds, 1, 5)
            wait_published(base, key, one)
            sa, a = http(base, key, f"/v1/jobs/{gang}/artifacts/adapter_model.safetensors")
            sb, b = http(base, key, f"/v1/jobs/{one}/artifacts/adapter_model.safetensors")
            check(sa == 200 and sb == 200 and len(a) > 1000, f"both adapters download ({sa}, {sb}, {len(a)} bytes)")
            check(a == b, "the gang's adapter equals one executor's on the same batches, byte for byte")
            recs = control_records(lathe, e, gang)
            for c, name in ((d, f"g1{run_id}"), (w2, f"g2{run_id}")):
                check(f"started {gang} attempt 1" in c.text(), f"worker {name} ran an executor of the gang job")
            disp = [r for r in recs if r.get("type") == "JobDispatched"]
            check(len(disp) == 1 and disp[0]["record"].get("gang_world") == 2 and
                  len(disp[0]["record"].get("gang_workers", [])) == 2,
                  "one JobDispatched on lathe.control names both workers, world 2")
            starters = {r["record"].get("worker_id") for r in recs if r.get("type") == "AttemptStarted"}
            check(starters == {disp[0]["record"]["worker_id"]}, f"only rank 0's worker started the attempt ({starters})")
            # 4. a worker of a running gang stopped with SIGTERM drains: the gang checkpoints and stops
            # as a preempted one (rank 0 here: by the worker itself; rank 1: the scheduler asks rank
            # 0's worker), and the worker exits 0 once its part has ended
            long = submit(lathe, e, key, ds, 2, 8, steps=100000)
            deadline = time.time() + 120
            while not any(r.get("type") == "AttemptStarted" for r in control_records(lathe, e, long)):
                check(time.time() < deadline, "the long gang job started")
                time.sleep(1)
            time.sleep(3)  # training, past the join
            w2.p.send_signal(signal.SIGTERM)
            try:
                rc = w2.p.wait(90)
            except subprocess.TimeoutExpired:
                rc = None
            w2.t.join(5)  # its last lines read
            check(rc == 0 and "worker drained, stopping" in w2.text(),
                  f"the SIGTERMed worker drained and exited 0 (exit {rc})")
            deadline = time.time() + 60
            while True:
                recs = control_records(lathe, e, long)
                stops = [r["record"] for r in recs if r.get("type") == "AttemptStopped"]
                if stops or time.time() > deadline:
                    break
                time.sleep(1)
            rank0 = [r["record"].get("worker_id") for r in recs if r.get("type") == "JobDispatched"][:1]
            print(f"gang: the drained worker held rank {0 if rank0 == [f'g2{run_id}'] else 1}", flush=True)
            check([x.get("reason") for x in stops] == ["preempt"],
                  f"the gang's attempt stopped once, as preempted ({[x.get('reason') for x in stops]})")
            st, body = http(base, key, f"/v1/jobs/{long}")
            check(st == 200 and json.loads(body).get("failed_attempts") == 0, "no failed attempt counted")
            run([lathe, "jobs", "cancel", long], e, "jobs cancel")
            # 5. the second worker cut off from the store
            w2 = Child("lathed worker (no store)", [lathed, "--role", "worker"],
                       dict(env, LATHE_INSTANCE=f"g2{run_id}", LATHE_WORKER_RENDEZVOUS=f"127.0.0.1:{free_port()}",
                            LATHE_S3_ENDPOINT=f"127.0.0.1:{free_port()}", LATHE_WORKER_STORE_RETRY_MS="1500", **group),
                       tag="gang")
            w2.wait_for(r"worker .* started", 60)
            time.sleep(6)  # its heartbeats follow the old process's before the partitions are read
            wait_partitions(lathe, env, [f"g1{run_id}", f"g2{run_id}"])
            t0 = time.time()
            away = submit(lathe, e, key, ds, 2, 6)
            j = wait_ended(base, key, away, 200)
            took = time.time() - t0
            check(j.get("state") == "failed" and "object store could not be reached" in (j.get("reason") or ""),
                  f"the gang job whose worker cannot reach the store failed as store_unavailable ({j.get('reason')})")
            check(j.get("failed_attempts") == 0, f"no failed attempt counted ({j.get('failed_attempts')})")
            recs = control_records(lathe, e, away)
            ranks0 = [r["record"].get("worker_id") for r in recs if r.get("type") == "JobDispatched"]
            print(f"gang: the worker without a store held rank {0 if ranks0[:1] == [f'g2{run_id}'] else 1}",
                  flush=True)
            stops = [r["record"] for r in recs if r.get("type") == "AttemptStopped"]
            check([s.get("reason") for s in stops] == ["unavailable", "unavailable"],
                  f"two attempts stopped, both unavailable ({[s.get('reason') for s in stops]})")
            check(took < 120, f"the rank waiting to join ended with its peer's stop, not at its join timeout "
                              f"({took:.0f} s for both attempts)")
        except BaseException:
            d.dump()
            w2.dump()
            raise
    finally:
        for c in (w2, d):
            if c:
                c.stop()
        lt_test.delete_topics(admin, prefix)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"gang: {len(CHECKS)} checks passed")


if __name__ == "__main__":
    main()
