#!/usr/bin/python3
"""bench_e2e: submission -> running and cancel -> stop latency on an idle fleet, against the
broker's own produce -> consume latency for one record measured in the same run.

Starts its own fleet on the local stack (ops/stack up; eval "$(ops/stack env)") under a fresh
topic prefix (b<random>.): `lathed --role api`, `--role scheduler` and one `--role worker`
(1 thread), a tenant, a 200-line dataset, and a tiny base model from
`lathe model make --steps 5 --out DIR`. After one warm-up job (not counted), one job at a time
(the fleet is idle for each):
  - submission -> running: jobs of 2 steps; from JobSubmitted.occurred_at (stamped by the API
    when it takes the request) to AttemptStarted.occurred_at (the worker's claim, its executor
    spawned): both read back from the topics with `lathe topic tail`;
  - cancel -> stop: a long job is submitted, and once it runs, cancelled through the API; from
    CancelRequested.occurred_at to AttemptStopped.occurred_at (the worker's confirmation that
    the executor stopped).
The peer: one record produced (acks=all, idempotent) and consumed back by an assigned consumer,
through librdkafka (python3-confluent-kafka), K times; p50/p99 of produce -> consume.
Timestamps are CLOCK_REALTIME milliseconds of processes on this one machine.

Usage: bench/bench_e2e.py [--build DIR] [--jobs K] [--cancels K]   (defaults build-perf, 10, 10)
Last line: `e2e_submit_to_running_p50_ms: X`. Deletes its topics at the end.
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pct(v, p):
    v = sorted(v)
    if not v:
        return float("nan")
    k = (len(v) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(top, "build-perf"))
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--cancels", type=int, default=10)
    ap.add_argument("--peer", type=int, default=50)
    a = ap.parse_args()
    lathe = os.path.join(a.build, "lathe")
    lathed = os.path.join(a.build, "lathed")
    for v in ("LATHE_KAFKA_BOOTSTRAP", "LATHE_S3_ENDPOINT", "LATHE_MASTER_KEY_FILE"):
        if v not in os.environ:
            sys.exit('bench_e2e: needs the local stack: eval "$(ops/stack env)" (%s unset)' % v)
    bootstrap = os.environ["LATHE_KAFKA_BOOTSTRAP"]
    prefix = "b%08x." % random.getrandbits(32)
    work = tempfile.mkdtemp(prefix="lt_bench_e2e_")
    models = os.path.join(work, "models")
    os.makedirs(models)
    port, ops_port = free_port(), free_port()
    env = dict(os.environ, LATHE_TOPIC_PREFIX=prefix, LATHE_MODELS_DIR=models,
               LATHE_API_URL="http://127.0.0.1:%d" % port)
    procs = []

    def run(*args, key=None, check=True):
        e = dict(env, LATHE_API_KEY=key) if key else env
        r = subprocess.run([lathe] + list(args), env=e, capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError("lathe %s: %s%s" % (" ".join(args), r.stdout, r.stderr))
        return r.stdout

    def stop_all():
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()

    try:
        t = time.time()
        run("model", "make", "--steps", "5", "--out", os.path.join(models, "lathe-tiny"))
        print("base model: lathe model make --steps 5 in %.1f s" % (time.time() - t), flush=True)
        run("admin", "topics")
        for role, inst in (("api", "api-1"), ("scheduler", "scheduler-1"), ("worker", "worker-1")):
            args = [lathed, "--role", role] + (["--port", str(port), "--operator-port", str(ops_port)]
                                               if role == "api" else [])
            log = open(os.path.join(work, role + ".log"), "w")
            procs.append(subprocess.Popen(args, env=dict(env, LATHE_INSTANCE=inst, LATHE_WORKER_THREADS="1"),
                                          stdout=log, stderr=subprocess.STDOUT))
        import urllib.request
        for _ in range(100):
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/healthz" % ops_port, timeout=1)
                break
            except Exception:
                time.sleep(0.2)
        key = json.loads(run("admin", "tenant", "create", "bench", "--name", "Bench", "--json"))["api_key"]
        train = os.path.join(work, "train.jsonl")
        with open(os.path.join(models, "lathe-tiny", "task_train.jsonl")) as f, open(train, "w") as o:
            for i, line in enumerate(f):
                if i >= 200:
                    break
                o.write(line)
        ds = json.loads(run("datasets", "upload", train, "--name", "bench", "--json", key=key))["id"]
        time.sleep(3)  # the worker's first heartbeat reaches the scheduler: the fleet is idle and known

        def submit(steps):
            out = run("jobs", "submit", "--model", "lathe-tiny", "--dataset", ds, "--priority", "production",
                      "--set", "max_steps=%d" % steps, "--set", "batch_size=2", "--set", "max_seq_len=64",
                      "--set", "checkpoint_interval=1000", "--set", "validation_fraction=0.05", "--json", key=key)
            return json.loads(out)["id"]

        def state(job):
            return json.loads(run("jobs", "show", job, "--json", key=key))["state"]

        def wait_for(job, states, timeout=300):
            t0 = time.time()
            while time.time() - t0 < timeout:
                s = state(job)
                if s in states:
                    return s
                time.sleep(0.05)
            raise RuntimeError("job %s not %s after %d s (state %s; logs in %s)" % (job, states, timeout, s, work))

        terminal = ("completed", "failed", "cancelled", "rejected")
        # one job first, not counted: the worker's consumer group settles, the scheduler learns
        # its partitions, the page cache holds the model (the first job of a cold fleet waited
        # up to ~19 s here)
        t = time.time()
        warm = submit(2)
        print("warm-up job %s: %s in %.1f s" % (warm, wait_for(warm, terminal), time.time() - t), flush=True)
        short = []
        for i in range(a.jobs):
            j = submit(2)
            short.append(j)
            s = wait_for(j, terminal)
            print("job %d/%d %s: %s" % (i + 1, a.jobs, j, s), flush=True)
        long_ = []
        for i in range(a.cancels):
            j = submit(100000)
            long_.append(j)
            wait_for(j, ("running",))
            time.sleep(0.5)  # a few training steps
            run("jobs", "cancel", j, key=key)
            s = wait_for(j, terminal)
            print("cancel %d/%d %s: %s" % (i + 1, a.cancels, j, s), flush=True)

        recs = {}
        for topic in ("jobs", "control"):
            out = run("topic", "tail", topic, "--from-beginning", "--timeout-ms", "3000")
            for line in out.splitlines():
                r = json.loads(line)
                if "record" not in r:
                    continue
                rec = r["record"]
                recs.setdefault((rec.get("job_id"), r["type"]), []).append(rec)

        def first(job, typ):
            v = recs.get((job, typ))
            return min(x["occurred_at"] for x in v) if v else None

        sub_run = []
        for j in short:
            s, r = first(j, "JobSubmitted"), first(j, "AttemptStarted")
            if s is not None and r is not None:
                sub_run.append(r - s)
        stops = []
        for j in long_:
            c, s = first(j, "CancelRequested"), first(j, "AttemptStopped")
            if c is not None and s is not None:
                stops.append(s - c)
        # where submission -> running goes: accepted, dispatched, started
        parts = {"JobAccepted": [], "JobDispatched": [], "AttemptStarted": []}
        for j in short:
            s = first(j, "JobSubmitted")
            prev = s
            for typ in ("JobAccepted", "JobDispatched", "AttemptStarted"):
                x = first(j, typ)
                if prev is not None and x is not None:
                    parts[typ].append(x - prev)
                prev = x

        # the peer: one record produced and consumed back, K times
        ptopic = prefix + "bench-peer"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(ptopic, 1, 1)])[ptopic].result(30)
        prod = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 0})
        cons = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-e2e-peer", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "fetch.wait.max.ms": 100})
        cons.assign([TopicPartition(ptopic, 0, 0)])
        prod.produce(ptopic, b"warm")
        prod.flush(30)
        t0 = time.time()
        while time.time() - t0 < 30:
            m = cons.poll(0.5)
            if m is not None and not m.error():
                break
        peer = []
        for i in range(a.peer):
            t0 = time.time()
            prod.produce(ptopic, b"x" * 150, key=b"job-peer")
            prod.poll(0)
            got = False
            while time.time() - t0 < 10:
                m = cons.poll(0.1)
                prod.poll(0)
                if m is not None and not m.error():
                    got = True
                    break
            if got:
                peer.append((time.time() - t0) * 1000.0)
        prod.flush(10)
        cons.close()

        print("fleet: api + scheduler + 1 worker (1 thread), prefix %s, logs %s" % (prefix, work))
        print("submission -> running (JobSubmitted -> AttemptStarted), %d jobs: p50 %.0f ms, p99 %.0f ms, "
              "min %.0f, max %.0f" % (len(sub_run), pct(sub_run, 50), pct(sub_run, 99), min(sub_run), max(sub_run)))
        print("  of which submitted -> accepted p50 %.0f ms, accepted -> dispatched p50 %.0f ms, dispatched -> "
              "started p50 %.0f ms" % (pct(parts["JobAccepted"], 50), pct(parts["JobDispatched"], 50),
                                        pct(parts["AttemptStarted"], 50)))
        print("cancel -> stop (CancelRequested -> AttemptStopped), %d jobs: p50 %.0f ms, p99 %.0f ms, min %.0f, "
              "max %.0f" % (len(stops), pct(stops, 50), pct(stops, 99), min(stops), max(stops)))
        print("peer, broker produce (acks=all) -> consume of one record, %d times: p50 %.1f ms, p99 %.1f ms"
              % (len(peer), pct(peer, 50), pct(peer, 99)))
        print("ratios to the broker's p50: submission -> running %.0fx, cancel -> stop %.0fx"
              % (pct(sub_run, 50) / pct(peer, 50), pct(stops, 50) / pct(peer, 50)))
        print("load average at the end: %s" % open("/proc/loadavg").read().split(" ")[:3])
        print("e2e_cancel_to_stop_p50_ms: %.0f" % pct(stops, 50))
        print("e2e_submit_to_running_p50_ms: %.0f" % pct(sub_run, 50))
    finally:
        stop_all()
        try:
            admin = AdminClient({"bootstrap.servers": bootstrap})
            names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
            if names:
                for f in admin.delete_topics(names).values():
                    try:
                        f.result(30)
                    except Exception:
                        pass
        except Exception as e:
            print("bench_e2e: could not delete topics %s*: %s" % (prefix, e), file=sys.stderr)
        if os.environ.get("LATHE_BENCH_KEEP") is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
