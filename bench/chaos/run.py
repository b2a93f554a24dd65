#!/usr/bin/python3
"""bench/chaos/run.py: Lathe's chaos driver. Each run starts a fleet of lathed processes on the
local stack (2 apis, 2 schedulers, 3 workers, 2 publishers, 2 samplers by default) under a fresh topic
prefix and fresh tenants, runs a seeded mixed workload (tenants, every priority class, managed
jobs, a training session, cancels; preemptions come from production work arriving on a full
fleet) while it injects faults at seeded random times, stops injecting, waits for the workload
to drain, samples every completed job's adapter through every sampler, then proves the
invariants with bench/chaos/check.py and tears everything down (always: no process, topic, netns
or object of the run is left behind).

Fault kinds (a kind the machine cannot do is skipped, and the run says so):
  kill_process           SIGKILL of a random lathed (any role); restarted after a seeded delay
  kill_scheduler_leader  SIGKILL of the scheduler that leads; restarted after a seeded delay
  kill_executor          SIGKILL of a running executor (a worker's child)
  pause_process          SIGSTOP of a random lathed for longer than the lease, then SIGCONT
  partition_worker       the worker in its own network namespace loses broker and store for
                         longer than the lease (bench/chaos/proxy.py cuts its relay), then heals
  broker_restart         `ops/stack broker stop N` / `start N` (when ops/stack has them)
  s3_restart             `ops/stack s3 stop` / `start` (when ops/stack has them)

usage: run.py --seed S [--runs N] [--duration SECONDS] [--faults K] [--jobs J] [--out DIR] ...
Environment: the stack's (`eval "$(ops/stack env)"`); LATHE_E2E_CACHE (the tiny base model,
made once); LATHE_CHAOS_STACK (the ops/stack script that stops and starts brokers and the store;
default: the one beside the stack's directory). Prints one table for all runs and exits non-zero on any violation."""
import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import check  # noqa: E402

CLASSES = ("production", "standard", "preemptible")
KINDS = ("kill_process", "kill_scheduler_leader", "kill_executor", "pause_process", "partition_worker",
         "broker_restart", "s3_restart")


def now_ms():
    return int(time.time() * 1000)


_ports_given = set()


def free_port():
    """A free port for a server of the fleet, below the kernel's ephemeral range: a port the kernel
    handed out (bind to 0) can become some client connection's local port before the server binds
    it (seed 6535: a sampler's operator port was taken at its start, and it never came up). Never
    the same port twice in one driver."""
    hi = 29000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            hi = min(hi, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        pass
    pick = random.SystemRandom()  # not the run's seeded generator: ports are not part of a seed
    for _ in range(500):
        p = pick.randrange(20000, hi)
        if p in _ports_given:
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            s.close()
        _ports_given.add(p)
        return p
    raise SystemExit("chaos: no free port in 20000..%d" % hi)


def stack_dir():
    d = os.environ.get("LATHE_STACK_DIR")
    if d:
        return d
    cfg = os.environ.get("LATHE_KAFKA_CONFIG_DIR")
    return os.path.dirname(cfg.rstrip("/")) if cfg else os.path.join(ROOT, ".stack")


def stack_cmd(*args, timeout=180):
    """Runs the stack's own ops/stack (the repository the stack lives in) with args."""
    sd = stack_dir()
    script = os.environ.get("LATHE_CHAOS_STACK") or os.path.join(os.path.dirname(sd), "ops", "stack")
    if not os.path.exists(script):
        script = os.path.join(ROOT, "ops", "stack")
    # A broker restart loads every partition of every prefix on the stack: minutes on a shared one.
    env = dict(os.environ, LATHE_STACK_DIR=sd, LATHE_STACK_TIMEOUT=os.environ.get("LATHE_STACK_TIMEOUT", "400"))
    return subprocess.run([script, *args], env=env, capture_output=True, text=True, timeout=timeout)


def available_kinds(want_partition):
    """The fault kinds this machine can inject, and why each other one is skipped."""
    kinds, skipped = ["kill_process", "kill_scheduler_leader", "kill_executor", "pause_process"], {}
    try:
        ok = stack_cmd("broker", "list", timeout=30).returncode == 0
    except Exception:
        ok = False
    if ok:
        kinds.append("broker_restart")
    else:
        skipped["broker_restart"] = "ops/stack has no `broker list|stop|start`"
    try:
        usage = stack_cmd("help", timeout=30)
        ok = "s3 stop" in (usage.stdout + usage.stderr)
    except Exception:
        ok = False
    if ok:
        kinds.append("s3_restart")
    else:
        skipped["s3_restart"] = "ops/stack has no `s3 stop|start`"
    if not want_partition:
        skipped["partition_worker"] = "--no-partition"
    elif os.geteuid() != 0 or not shutil.which("ip"):
        skipped["partition_worker"] = "needs root and iproute2 (ip netns)"
    else:
        kinds.append("partition_worker")
    return kinds, skipped


# ---------------------------------------------------------------- the fleet

class Proc:
    """One lathed process of the fleet: started, killed, paused and restarted by name."""

    def __init__(self, name, role, argv, env, logdir, netns=None):
        self.name, self.role, self.argv, self.env, self.netns = name, role, argv, env, netns
        self.log = os.path.join(logdir, name + ".log")
        self.p = None
        self.starts = 0
        self.paused = False
        self.killed = False  # by the driver, which restarts it itself

    def start(self):
        argv = (["ip", "netns", "exec", self.netns] if self.netns else []) + self.argv
        with open(self.log, "a") as f:
            f.write(f"=== chaos: start {self.starts + 1} at {now_ms()}\n")
            self.p = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                      start_new_session=True)
        self.starts += 1
        self.paused = False
        self.killed = False

    def alive(self):
        return self.p is not None and self.p.poll() is None

    def signal(self, sig):
        if self.alive():
            os.kill(self.p.pid, sig)

    def stop(self):
        if self.p is None:
            return
        if self.paused:
            self.signal(signal.SIGCONT)
        if self.alive():  # SIGINT: a worker stops now (SIGTERM would drain it first)
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for pid in descendants(self.p.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.alive():
            self.p.kill()
        self.p.wait(10)

    def text_since_start(self):
        try:
            with open(self.log, errors="replace") as f:
                t = f.read()
        except FileNotFoundError:
            return ""
        return t[t.rfind("=== chaos: start"):]


def unfolded_resumes(path):
    """(job, line) for each time a publisher said a dispatch resumed from a checkpoint commit it
    never folded (a record its consumer or fold missed: seed 6528), over every start in its log."""
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f if "which this publisher never folded" in ln]
    except FileNotFoundError:
        return []
    found = [(re.search(r"job (\S+): attempt", ln), ln) for ln in lines]
    return [(m.group(1) if m else "?", ln) for m, ln in found]


def descendants(pid):
    """Every descendant of pid (through /proc's children lists)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = [int(x) for x in f.read().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError):
            kids = []
        out += kids
        todo += kids
    return out


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return []


class Fleet:
    def __init__(self, a, env, rundir, netns):
        self.procs = collections.OrderedDict()
        self.lock = threading.Lock()
        self.api_ports = []
        lathed = a.lathed
        for i in range(1, a.apis + 1):
            port, ops = free_port(), free_port()
            self.api_ports.append((port, ops))
            self.add(f"api{i}", "api", [lathed, "--role", "api", "--port", str(port), "--operator-port", str(ops)],
                     env, rundir)
        for i in range(1, a.schedulers + 1):
            self.add(f"sched{i}", "scheduler", [lathed, "--role", "scheduler"], env, rundir)
        for i in range(1, a.publishers + 1):
            self.add(f"pub{i}", "publisher", [lathed, "--role", "publisher"], env, rundir)
        for i in range(1, a.workers + 1):
            ns = netns if (netns and i == a.workers) else None
            self.add(f"w{i}", "worker", [lathed, "--role", "worker"], env, rundir, ns)
        self.sampler_ports = []
        for i in range(1, a.samplers + 1):
            port, ops = free_port(), free_port()
            self.sampler_ports.append((port, ops))
            self.add(f"sampler{i}", "sampler", [lathed, "--role", "sampler", "--port", str(port),
                                                "--operator-port", str(ops)], dict(env, LATHE_SAMPLER_THREADS="1"),
                     rundir)

    def add(self, name, role, argv, env, rundir, netns=None):
        self.procs[name] = Proc(name, role, argv, dict(env, LATHE_INSTANCE=name), rundir, netns)

    def start(self):
        for p in self.procs.values():
            p.start()

    def urls(self):
        return [f"http://127.0.0.1:{p}" for p, _ in self.api_ports]

    def leader(self):
        """The scheduler whose latest start printed `leading` and that still runs."""
        best = None
        for p in self.procs.values():
            if p.role == "scheduler" and p.alive() and not p.paused:
                t = p.text_since_start()
                i = t.rfind("scheduler: leading")
                if i >= 0 and t.rfind("stops leading") < i:
                    best = p
        return best

    def stop(self):
        with self.lock:
            self._stop()

    def _stop(self):
        for p in reversed(list(self.procs.values())):
            try:
                p.stop()
            except Exception as e:  # keep stopping the others
                print(f"chaos: stopping {p.name}: {e}", file=sys.stderr)


# ---------------------------------------------------------------- HTTP

def http(url, key, method, path, body=None, headers=None, timeout=20):
    data = json.dumps(body).encode() if body is not None else None
    h = {"Authorization": f"Bearer {key}", "Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw[:1] in (b"{", b"[") else raw)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw
    except (OSError, ValueError) as e:  # refused, reset, timed out: unknown outcome
        return None, str(e)


class Log:
    """The driver's JSONL: what was acknowledged, cancelled and injected, and when."""

    def __init__(self, path):
        self.path = path
        self.f = open(path, "a")
        self.lock = threading.Lock()
        self.events = []

    def __call__(self, ev, **kw):
        e = {"ev": ev, "t": now_ms(), **kw}
        with self.lock:
            self.events.append(e)
            self.f.write(json.dumps(e) + "\n")
            self.f.flush()
        return e

    def close(self):
        self.f.close()


# ---------------------------------------------------------------- one run

class Run:
    def __init__(self, a, seed, log, rundir):
        self.a, self.seed, self.log, self.rundir = a, seed, log, rundir
        self.rng = random.Random(seed)
        self.tag = f"c{seed}x{os.getpid() % 10000}"
        self.prefix = f"chaos{seed}x{os.getpid() % 10000}."
        self.env = dict(os.environ, LATHE_TOPIC_PREFIX=self.prefix, LATHE_MODELS_DIR=a.models,
                        LATHE_LEASE_MS=str(a.lease_ms), LATHE_LEASE_MARGIN_MS=str(a.margin_ms),
                        LATHE_START_TIMEOUT_MS=str(a.start_timeout_ms), LATHE_KILL_DEADLINE_MS=str(a.kill_ms),
                        LATHE_GC_GRACE_MS=str(a.gc_grace_ms), LATHE_PREEMPT_AFTER_S=str(a.preempt_after_s),
                        LATHE_PUBLISHER_LOG_COMMITS="1",
                        LATHE_API_KEY_RATE="off",
                        LATHE_API_TENANT_RATE="off", LATHE_API_AUTH_FAIL_RATE="off", LATHE_WORKER_SLOTS="1",
                        LATHE_WORKER_THREADS="1")
        self.fleet = None
        self.netns = None
        self.proxy = None
        self.tenants = {}      # tenant id -> (api key, dataset id)
        self.jobs = {}         # job id -> submit event
        self.stop = threading.Event()
        self.restores = []     # threads that undo a fault (restart, SIGCONT, heal)
        self.faults = collections.Counter()

    # ---- set up and tear down

    def setup(self):
        p = subprocess.run([self.a.lathe, "admin", "topics"], env=self.env, capture_output=True, text=True,
                           timeout=180)
        if p.returncode:
            raise RuntimeError(f"lathe admin topics: {p.stderr.strip()}")
        if "partition_worker" in self.kinds:
            self.netns = f"lch{self.tag}"[:15]
            subprocess.run(["ip", "netns", "add", self.netns], check=True)
            subprocess.run(["ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up"], check=True)
            # every broker (a cluster's bootstrap names each) and the store: a worker that
            # reached only one broker would heartbeat and never see its dispatches
            brokers = os.environ.get("LATHE_KAFKA_BOOTSTRAP", "127.0.0.1:9092").split(",")
            ports = [b.strip().rsplit(":", 1)[-1] for b in brokers if b.strip()] + \
                [os.environ.get("LATHE_S3_ENDPOINT", "127.0.0.1:9000").rsplit(":", 1)[-1]]
            self.proxy = subprocess.Popen([sys.executable, os.path.join(HERE, "proxy.py"), self.netns, *ports],
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if "ready" not in self.proxy.stdout.readline():
                raise RuntimeError("proxy.py did not start")
        for i in range(self.a.tenants):
            tid = f"{self.tag}t{i}"
            p = subprocess.run([self.a.lathe, "admin", "tenant", "create", tid, "--weight", str(1 + i % 2),
                                "--json"], env=self.env, capture_output=True, text=True, timeout=60)
            if p.returncode:
                raise RuntimeError(f"tenant create: {p.stderr.strip()}")
            self.tenants[tid] = [json.loads(p.stdout)["api_key"], None]
        self.log("run", seed=self.seed, prefix=self.prefix, tenants=list(self.tenants),
                 store_dir=self.a.store_dir, kinds=self.kinds, skipped=self.skipped,
                 conf={"kill_deadline_ms": self.a.kill_ms, "lease_ms": self.a.lease_ms,
                       "lease_margin_ms": self.a.margin_ms, "start_timeout_ms": self.a.start_timeout_ms,
                       "keep_checkpoints": 2, "slack_ms": 5000})
        self.fleet = Fleet(self.a, self.env, self.rundir, self.netns)
        self.fleet.start()
        threading.Thread(target=self.supervise, daemon=True).start()
        self.wait_ready()
        data = os.path.join(self.rundir, "train.jsonl")
        with open(os.path.join(self.a.models, "lathe-tiny", "task_train.jsonl")) as f, open(data, "w") as o:
            o.writelines(line for i, line in enumerate(f) if i < 200)
        for tid, kv in self.tenants.items():
            for _ in range(60):
                p = subprocess.run([self.a.lathe, "datasets", "upload", data, "--json", "--url", self.fleet.urls()[0],
                                    "--api-key", kv[0]], capture_output=True, text=True, timeout=120)
                if p.returncode == 0:
                    kv[1] = json.loads(p.stdout.splitlines()[0])["id"]
                    break
                time.sleep(1)
            else:
                raise RuntimeError(f"dataset upload for {tid}: {p.stderr.strip()}")

    def wait_ready(self, timeout=120):
        """Until every api and sampler answers /healthz 200 and a scheduler leads."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            ok = all(http(f"http://127.0.0.1:{ops}", "", "GET", "/healthz", timeout=3)[0] == 200
                     for _, ops in self.fleet.api_ports + self.fleet.sampler_ports)
            if ok and self.fleet.leader():
                return
            time.sleep(0.5)
        raise RuntimeError("the fleet did not become ready (apis healthy, a scheduler leading)")

    def teardown(self):
        for t in self.restores:
            t.cancel()
        if self.fleet:
            self.fleet.stop()
        stray = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if self.ours(pid)]
        for pid in stray:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if stray:
            print(f"chaos: seed {self.seed}: killed {len(stray)} stray processes of the run: {stray}", flush=True)
        if self.proxy:
            self.proxy.terminate()
            self.proxy.wait(10)
        if self.netns:
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        if not self.a.keep:
            delete_topics(self.prefix)
            for top in ("staging", "tenants", "sessions"):
                for t in self.tenants:
                    shutil.rmtree(os.path.join(self.a.store_dir, top, t), ignore_errors=True)

    def ours(self, pid):
        """Is pid a process of this run (its environment names the run's topic prefix)?"""
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                return f"LATHE_TOPIC_PREFIX={self.prefix}".encode() in f.read().split(b"\0")
        except OSError:
            return False

    # ---- the workload

    def job_plan(self):
        """Each job's tenant, class, steps and cancel time, drawn up front (so that a seed gives the
        same workload whatever the threads do), and when it is submitted. The first wave, one job
        per worker, is long preemptible work at the start: the production jobs that come later
        find the fleet full and preempt it."""
        plan = []
        for i in range(self.a.jobs):
            wave = i < self.a.workers and self.a.preempt_wave
            plan.append((self.rng.uniform(0, 0.05 if wave else 0.5) * self.a.duration, "job", {
                "i": i, "tenant": self.rng.choice(sorted(self.tenants)),
                "cls": "preemptible" if wave else self.rng.choice(CLASSES),
                "steps": self.rng.randint(self.a.min_steps, self.a.max_steps) * (3 if wave else 1),
                "cancel_at": self.rng.uniform(0.5, 8.0) if self.rng.random() < self.a.cancel_p else None}))
        return plan

    def submit(self, job):
        i, tid, cls, steps = job["i"], job["tenant"], job["cls"], job["steps"]
        rng = random.Random(self.seed * 1000 + i)
        key, ds = self.tenants[tid]
        body = {"base_model": "lathe-tiny", "dataset_id": ds, "priority": cls,
                "hyperparameters": {"max_steps": steps, "batch_size": 2, "lora_rank": 4, "eval_interval": 0,
                                    "checkpoint_interval": self.a.ckpt_interval, "seed": i}}
        idem = f"{self.tag}-{i}"
        cancel_at = job["cancel_at"]
        t0 = time.time()
        while time.time() - t0 < 60 and not self.stop.is_set():
            url = rng.choice(self.fleet.urls())
            st, r = http(url, key, "POST", "/v1/jobs", body, {"Idempotency-Key": idem})
            if st in (200, 201, 202) and isinstance(r, dict) and r.get("id"):
                e = self.log("submit", job=r["id"], tenant=tid, cls=cls, steps=steps, status=st, acked=True)
                self.jobs[r["id"]] = e
                if cancel_at is not None:
                    self.later(cancel_at, self.cancel, r["id"], key, rng)
                return
            if st is not None and 400 <= st < 500 and st != 429:
                self.log("submit_refused", tenant=tid, status=st, detail=str(r)[:300])
                return
            time.sleep(0.5)
        self.log("submit_unknown", tenant=tid, idem=idem)

    def cancel(self, job, key, rng):
        for _ in range(40):
            st, r = http(rng.choice(self.fleet.urls()), key, "POST", f"/v1/jobs/{job}/cancel")
            if st in (200, 202):
                self.log("cancel", job=job, status=st)
                return
            if st in (404, 409):  # ended first, or not yet folded by that api
                if st == 409:
                    self.log("cancel_late", job=job, status=st)
                    return
            time.sleep(0.5)
        self.log("cancel_unknown", job=job)

    def later(self, delay, fn, *args):
        t = threading.Timer(delay, self.guard, (fn, *args))
        t.daemon = True
        t.start()
        self.restores.append(t)

    def guard(self, fn, *args):
        try:
            fn(*args)
        except Exception as e:
            self.log("driver_error", detail=f"{fn.__name__}: {e}")

    def session(self):
        """One training session: a few steps, a save, then end (or cancel), surviving faults."""
        sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
        import lathe_client
        rng = random.Random(self.seed * 1000 + 999)  # its own: it runs on a thread of its own
        tid = rng.choice(sorted(self.tenants))
        key = self.tenants[tid][0]
        cancel = rng.random() < self.a.cancel_p
        svc = lathe_client.ServiceClient(base_url=self.fleet.urls()[0], api_key=key, timeout=30)
        tc = None
        for _ in range(20):
            try:
                tc = svc.create_lora_training_client("lathe-tiny", rank=4, alpha=8, seed=self.seed)
                break
            except Exception:
                time.sleep(1)
        if tc is None:
            self.log("submit_unknown", tenant=tid, kind="session")
            return
        self.jobs[tc.id] = self.log("submit", job=tc.id, tenant=tid, cls="standard", kind="session", acked=True)
        tok = svc.tokenize("lathe-tiny", "date: March 5, 2021\niso:")
        comp = svc.tokenize("lathe-tiny", " 2021-03-05")
        batch = [lathe_client.sft_datum(tok, comp)]
        for i in range(4):
            if self.stop.is_set():
                break
            try:
                tc.forward_backward(batch)
                tc.optim_step(lathe_client.AdamParams(lr=1e-2)).result(timeout=60)
                if i == 1:
                    tc.save_state("two").result(timeout=60)
            except Exception as e:
                self.log("session_call_failed", job=tc.id, detail=str(e)[:200])
        for _ in range(60):
            st, _ = http(rng.choice(self.fleet.urls()), key, "POST" if cancel else "DELETE",
                         f"/v1/sessions/{tc.id}/cancel" if cancel else f"/v1/sessions/{tc.id}")
            if st in (200, 202, 204):
                self.log("cancel" if cancel else "session_end", job=tc.id, status=st)
                return
            if st == 409:
                return
            time.sleep(1)

    # ---- faults

    def inject(self, kind):
        a, fl = self.a, self.fleet
        with fl.lock:
            if kind in ("kill_process", "kill_scheduler_leader"):
                if kind == "kill_process":
                    cands = [p for p in fl.procs.values() if p.alive() and not p.paused]
                    p = self.rng.choice(cands) if cands else None
                else:
                    p = fl.leader()
                if p is None:
                    return False
                p.killed = True
                p.signal(signal.SIGKILL)
                p.p.wait(10)
                delay = self.rng.uniform(0.5, 3.0)
                self.log("fault", kind=kind, target=p.name, restart_after_s=round(delay, 2))
                self.later(delay, self.restart, p)
                return True
            if kind == "kill_executor":
                ex = [(w, pid) for w in fl.procs.values() if w.role == "worker" and w.alive()
                      for pid in descendants(w.p.pid) if b"executor" in b" ".join(cmdline(pid))]
                if not ex:
                    return False
                w, pid = self.rng.choice(ex)
                os.kill(pid, signal.SIGKILL)
                self.log("fault", kind=kind, target=f"{w.name}/{pid}")
                return True
            if kind == "pause_process":
                cands = [p for p in fl.procs.values() if p.alive() and not p.paused]
                if not cands:
                    return False
                p = self.rng.choice(cands)
                hold = self.rng.uniform(1.5, 2.5) * a.lease_ms / 1000
                p.signal(signal.SIGSTOP)
                p.paused = True
                self.log("fault", kind=kind, target=p.name, hold_s=round(hold, 2))
                self.later(hold, self.resume, p)
                return True
            if kind == "partition_worker":
                w = next((p for p in fl.procs.values() if p.netns), None)
                if w is None or not self.proxy or getattr(self, "cut", False):
                    return False
                hold = self.rng.uniform(2.0, 3.0) * a.lease_ms / 1000
                self.proxy.send_signal(signal.SIGUSR1)
                self.cut = True
                self.log("fault", kind=kind, target=w.name, hold_s=round(hold, 2))
                self.later(hold, self.heal)
                return True
            if kind == "broker_restart":
                p = stack_cmd("broker", "list", timeout=30)
                ids = [x.split()[0] for x in p.stdout.splitlines() if x.strip() and x.split()[0].isdigit()] or ["1"]
                b = self.rng.choice(ids)
                stack_cmd("broker", "stop", b, timeout=60)
                hold = self.rng.uniform(2.0, 6.0)
                self.log("fault", kind=kind, target=f"broker{b}", hold_s=round(hold, 2))
                self.later(hold, self.stack_start, "broker", b)
                return True
            if kind == "s3_restart":
                stack_cmd("s3", "stop", timeout=60)
                hold = self.rng.uniform(2.0, 6.0)
                self.log("fault", kind=kind, target="s3", hold_s=round(hold, 2))
                self.later(hold, self.stack_start, "s3")
                return True
        return False

    def stack_start(self, what, *args):
        """`ops/stack broker start N` / `s3 start`, which return once the server answers."""
        p = stack_cmd(what, "start", *args, timeout=450)
        self.log("restored", target=what + "".join(args), how=f"ops/stack {what} start: exit {p.returncode}")
        if p.returncode:
            self.log("unhealthy", proc=what + "".join(args), detail=f"ops/stack {what} start: {p.stderr.strip()[-300:]}")

    def supervise(self):
        """What systemd does for the units in ops/systemd (Restart=on-failure, RestartSec=2): a
        process that exits by itself (a worker started while the broker was away gives up) is
        started again 2 s later."""
        while not self.stop.wait(2):
            with self.fleet.lock:
                for p in self.fleet.procs.values():
                    if self.stop.is_set():
                        return
                    if p.p is not None and not p.alive() and not p.killed:
                        rc = p.p.returncode
                        p.start()
                        self.log("supervisor_restart", target=p.name, exit=rc)

    def restart(self, p):
        with self.fleet.lock:
            if not p.alive() and not self.stop.is_set():
                p.start()
                self.log("restored", target=p.name, how="restart")

    def resume(self, p):
        with self.fleet.lock:
            p.signal(signal.SIGCONT)
            p.paused = False
            self.log("restored", target=p.name, how="SIGCONT")

    def heal(self):
        self.proxy.send_signal(signal.SIGUSR2)
        self.cut = False
        self.log("restored", target="partition", how="heal")

    def fault_plan(self):
        """Seeded times in the first 80% of the run, kinds dealt round-robin from a shuffled deck
        so that every kind comes up about as often."""
        times = sorted(self.rng.uniform(0.1, 0.8) * self.a.duration for _ in range(self.a.faults))
        deck = []
        while len(deck) < len(times):
            k = list(self.kinds)
            self.rng.shuffle(k)
            deck += k
        return list(zip(times, deck))

    # ---- the whole run

    def execute(self):
        self.kinds, self.skipped = available_kinds(not self.a.no_partition)
        if self.a.kinds:
            self.kinds = [k for k in self.kinds if k in self.a.kinds.split(",")]
        for k, why in self.skipped.items():
            print(f"chaos: seed {self.seed}: fault kind {k} skipped: {why}", flush=True)
        try:
            self.setup()
            t0 = time.time()
            plan = self.job_plan()
            plan += [(self.rng.uniform(0, 0.3) * self.a.duration, "session", i) for i in range(self.a.sessions)]
            plan += [(t, "fault", k) for t, k in self.fault_plan()]
            plan.sort(key=lambda x: x[0])
            workers = []
            for at, what, arg in plan:
                time.sleep(max(0.0, t0 + at - time.time()))
                if what == "job":
                    th = threading.Thread(target=self.guard, args=(self.submit, arg), daemon=True)
                elif what == "session":
                    th = threading.Thread(target=self.guard, args=(self.session,), daemon=True)
                else:
                    th = None
                    ok = False
                    for _ in range(10):  # an executor may not be running at this instant
                        ok = self.inject(arg)
                        if ok:
                            break
                        time.sleep(0.3)
                    if ok:
                        self.faults[arg] += 1
                    else:
                        self.log("fault_not_injected", kind=arg)
                if th:
                    th.start()
                    workers.append(th)
            time.sleep(max(0.0, t0 + self.a.duration - time.time()))
            for th in workers:
                th.join(90)
            for t in list(self.restores):
                t.join(60)
            self.drain()
            return self.finish()
        except Exception as e:
            self.log("driver_error", detail=str(e))
            print(f"chaos: seed {self.seed}: {e}", file=sys.stderr, flush=True)
            self.log("unhealthy", proc="driver", detail=f"the run could not complete: {e}")
            return self.finish(check_world=False)
        finally:
            self.stop.set()
            self.teardown()

    def job_state(self, job):
        key = self.tenants[self.jobs[job]["tenant"]][0]
        kind = "sessions" if self.jobs[job].get("kind") == "session" else "jobs"
        for url in self.fleet.urls():
            st, r = http(url, key, "GET", f"/v1/{kind}/{job}")
            if st == 200 and isinstance(r, dict):
                return r.get("state"), r
        return None, None

    def drain(self):
        """Until every acknowledged job is terminal and every completed one is published."""
        deadline = time.time() + self.a.drain_timeout
        terminal = ("completed", "failed", "cancelled", "rejected")
        self.end_orphan_sessions(terminal)
        pending = set(self.jobs)
        while pending and time.time() < deadline:
            for job in list(pending):
                st, r = self.job_state(job)
                if st in terminal and (st != "completed" or self.published(job)):
                    pending.discard(job)
            if pending:
                time.sleep(1)
        if pending:
            self.log("not_drained", jobs=sorted(pending), detail=f"{len(pending)} jobs not terminal and published "
                     f"after {self.a.drain_timeout} s")
        self.sweep_store()
        time.sleep(2 * self.a.gc_grace_ms / 1000 + 2)  # one GC pass past the grace period
        self.log("gc_done")

    def sweep_store(self):
        """S3Proxy keeps the file of an upload whose client vanished (a partitioned worker), and
        that file breaks every listing of its directory, the GC's among them (seed 9050); a real
        object store shows nothing of it. `ops/stack s3 sweep` removes such files, as S3Proxy's
        own start does, when nothing has written them for 10 s (every job is terminal by now)."""
        p = stack_cmd("s3", "sweep", "10", timeout=120)
        self.log("store_swept", how=f"ops/stack s3 sweep 10: exit {p.returncode}: {p.stderr.strip()[-200:]}")

    def end_orphan_sessions(self, terminal):
        """A session whose creation the client saw fail (a timeout while the broker was away) may
        exist all the same: a careful client lists its sessions and ends the ones it does not know,
        as the driver does here; they are then checked like every other job."""
        for tid, (key, _) in self.tenants.items():
            st, r = http(self.fleet.urls()[0], key, "GET", "/v1/sessions")
            for ses in (r.get("data", []) if st == 200 and isinstance(r, dict) else []):
                if ses.get("id") in self.jobs or ses.get("state") in terminal:
                    continue
                st2, _ = http(self.fleet.urls()[0], key, "DELETE", f"/v1/sessions/{ses['id']}")
                self.jobs[ses["id"]] = self.log("submit", job=ses["id"], tenant=tid, kind="session", acked=False,
                                                orphan=True, end_status=st2)

    def published(self, job):
        key = self.tenants[self.jobs[job]["tenant"]][0]
        kind = "sessions" if self.jobs[job].get("kind") == "session" else "jobs"
        st, r = http(self.fleet.urls()[0], key, "GET", f"/v1/{kind}/{job}/artifacts")
        return st == 200 and isinstance(r, dict) and bool(r.get("artifacts") or r.get("data"))

    def finish(self, check_world=True):
        if check_world:
            self.sample_prompt = "date: March 5, 2021\niso:"
            for p in self.fleet.procs.values():
                if not p.alive():
                    self.log("unhealthy", proc=p.name, detail=f"exited {p.p.returncode} after the run")
                for job, line in unfolded_resumes(p.log) if p.role == "publisher" else ():
                    self.log("unfolded_resume", proc=p.name, job=job, detail=line[-400:])
            for job in self.jobs:
                st, _ = self.job_state(job)
                self.log("final_state", job=job, state=st)
                if st == "completed" and self.jobs[job].get("kind") != "session":
                    self.download(job)
                    self.sample(job)
            self.digests()
        res = check.Result()
        if check_world:
            try:
                recs = check.read_topics(self.a.lathe, self.prefix, self.env)
                with open(os.path.join(self.rundir, "records.jsonl"), "w") as f:  # the evidence, kept
                    for t in check.TOPICS:
                        f.writelines(json.dumps(m) + "\n" for m in recs.get(t, []))
                store = check.list_store(self.a.store_dir, list(self.tenants))
                check.check_records(recs, self.log.events, store, res)
            except BaseException as e:
                self.log("unhealthy", proc="checker", detail=str(e))
        for e in self.log.events:
            if e["ev"] in ("unhealthy", "not_drained") and not check_world:
                res.add("fleet_unhealthy" if e["ev"] == "unhealthy" else "not_drained", e.get("proc", "?"),
                        e.get("detail", ""))
        return res

    def download(self, job):
        """`lathe jobs download`: every published artifact, checked against its record's sha256."""
        out = os.path.join(self.rundir, "download", job)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        key = self.tenants[self.jobs[job]["tenant"]][0]
        p = subprocess.run([self.a.lathe, "jobs", "download", job, out, "--url", self.fleet.urls()[0],
                            "--api-key", key], capture_output=True, text=True, timeout=120)
        self.log("download", job=job, ok=p.returncode == 0, detail=p.stderr.strip()[-300:])
        shutil.rmtree(out, ignore_errors=True)

    def sample(self, job):
        """The fine-tuned adapter of a completed job through every sampler (greedy, a fixed seed):
        each must answer (sample, 200; a restarted sampler may still be reading the log: 503 is
        retried for 30 s), all the same tokens and logprobs; another tenant asking for it gets 404
        (sample_probe)."""
        tid = self.jobs[job]["tenant"]
        key = self.tenants[tid][0]
        body = {"model": f"ft:lathe-tiny:{job}", "prompt": self.sample_prompt, "max_tokens": 8, "temperature": 0,
                "seed": 7, "logprobs": 1}
        for i, (port, _) in enumerate(self.fleet.sampler_ports):
            deadline = time.time() + 30
            while True:
                st, r = http(f"http://127.0.0.1:{port}", key, "POST", "/v1/completions", body, timeout=60)
                if st not in (None, 429, 503) or time.time() > deadline:
                    break
                time.sleep(0.5)
            ch = (r.get("choices") or [{}])[0] if st == 200 and isinstance(r, dict) else {}
            self.log("sample", job=job, tenant=tid, sampler=f"sampler{i + 1}", status=st, request_id=(
                r.get("id") if isinstance(r, dict) else None), text=ch.get("text"),
                logprobs=(ch.get("logprobs") or {}).get("token_logprobs"), prompt=self.sample_prompt,
                detail="" if st == 200 else str(r)[:200])
        other = next((t for t in sorted(self.tenants) if t != tid), None)
        if other and self.fleet.sampler_ports:
            st, r = http(f"http://127.0.0.1:{self.fleet.sampler_ports[0][0]}", self.tenants[other][0], "POST",
                         "/v1/completions", body, timeout=60)
            self.log("sample_probe", job=job, owner=tid, tenant=other, status=st, detail=str(r)[:200])

    def digests(self):
        """Each live api's digest against `lathe admin replay`'s, until they agree (30 s)."""
        last = None
        for _ in range(30):
            p = subprocess.run([self.a.lathe, "admin", "replay", "--json"], env=self.env, capture_output=True,
                               text=True, timeout=120)
            replay = json.loads(p.stdout) if p.returncode == 0 else {}
            apis = []
            for i, (_, ops) in enumerate(self.fleet.api_ports):
                st, h = http(f"http://127.0.0.1:{ops}", "", "GET", "/healthz")
                apis.append((f"api{i + 1}", h if isinstance(h, dict) else {}))
            last = (replay, apis)
            if replay.get("digest") and all(h.get("digest") == replay["digest"] for _, h in apis):
                break
            time.sleep(1)
        replay, apis = last
        self.log("replay_digest", digest=replay.get("digest"), records=replay.get("records"))
        for name, h in apis:
            self.log("api_digest", api=name, digest=h.get("digest"), records_folded=h.get("records_folded"))
        if any(h.get("digest") != replay.get("digest") for _, h in apis):
            self.digest_diff()

    def digest_diff(self):
        """Which jobs differ, field by field: each api's /debug/jobs against the replay's lines."""
        p = subprocess.run([self.a.lathe, "admin", "replay", "--json", "--jobs"], env=self.env, capture_output=True,
                           text=True, timeout=120)
        want = set(json.loads(p.stdout).get("job_lines", [])) if p.returncode == 0 else set()
        for i, (_, ops) in enumerate(self.fleet.api_ports):
            st, r = http(f"http://127.0.0.1:{ops}", "", "GET", "/debug/jobs")
            got = set(r.get("jobs", [])) if st == 200 and isinstance(r, dict) else set()
            if got != want:
                self.log("digest_diff", api=f"api{i + 1}", api_only=sorted(got - want)[:6],
                         replay_only=sorted(want - got)[:6])


def delete_topics(prefix):
    try:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        import lt_test
        from confluent_kafka.admin import AdminClient
        lt_test.delete_topics(AdminClient(lt_test.kafka_conf()), prefix)
    except Exception as e:
        print(f"chaos: deleting topics {prefix}*: {e}", file=sys.stderr)


def parse(argv):
    ap = argparse.ArgumentParser(description="Lathe's chaos driver (bench/chaos/run.py; see its docstring).")
    ap.add_argument("--seed", type=int, required=True, help="first run's seed; run i uses seed + i")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--duration", type=float, default=60, help="seconds of workload and faults per run")
    ap.add_argument("--faults", type=int, default=4, help="faults per run")
    ap.add_argument("--kinds", help="comma-separated fault kinds to use (default: every available one)")
    ap.add_argument("--jobs", type=int, default=8, help="managed jobs per run")
    ap.add_argument("--sessions", type=int, default=1, help="training sessions per run")
    ap.add_argument("--tenants", type=int, default=3)
    ap.add_argument("--apis", type=int, default=2)
    ap.add_argument("--schedulers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--samplers", type=int, default=2, help="sampler processes (each completed job is sampled "
                    "through every one at the end)")
    ap.add_argument("--min-steps", type=int, default=80)
    ap.add_argument("--max-steps", type=int, default=300)
    ap.add_argument("--ckpt-interval", type=int, default=20, help="checkpoint_interval (steps) of every job")
    ap.add_argument("--no-preempt-wave", dest="preempt_wave", action="store_false",
                    help="no first wave of long preemptible jobs (one per worker)")
    ap.add_argument("--cancel-p", type=float, default=0.25, help="chance a job or session is cancelled")
    ap.add_argument("--lease-ms", type=int, default=3000)
    ap.add_argument("--margin-ms", type=int, default=1000)
    ap.add_argument("--start-timeout-ms", type=int, default=10000)
    ap.add_argument("--kill-ms", type=int, default=3000, help="the workers' kill deadline")
    ap.add_argument("--gc-grace-ms", type=int, default=3000, help="the publishers' staging GC grace")
    ap.add_argument("--preempt-after-s", type=float, default=3, help="the scheduler's preemption wait")
    ap.add_argument("--drain-timeout", type=float, default=180)
    ap.add_argument("--no-partition", action="store_true", help="no worker in a network namespace")
    ap.add_argument("--require-faults", type=int, default=0,
                    help="exit non-zero unless at least this many faults were injected in all")
    ap.add_argument("--keep", action="store_true", help="keep the runs' topics and objects")
    ap.add_argument("--out", help="directory for the runs' logs (default: a new temporary one)")
    ap.add_argument("--lathe", default=os.environ.get("LATHE_CLI") or os.path.join(ROOT, "build", "lathe"))
    ap.add_argument("--lathed", default=os.environ.get("LATHED") or os.path.join(ROOT, "build", "lathed"))
    ap.add_argument("--models", default=os.environ.get("LATHE_E2E_CACHE") or "/tmp/lathe-e2e-models")
    ap.add_argument("--store-dir", default=None, help="the store's files (default: the stack's S3Proxy data)")
    a = ap.parse_args(argv)
    a.store_dir = a.store_dir or check.default_store_dir_of(stack_dir())
    return a


def ensure_model(a):
    if not os.path.exists(os.path.join(a.models, "lathe-tiny", "model.safetensors")):
        p = subprocess.run([a.lathe, "model", "make", "--steps", "20", "--threads", "2", "--out",
                            os.path.join(a.models, "lathe-tiny")], capture_output=True, text=True, timeout=1200)
        if p.returncode:
            sys.exit(f"chaos: lathe model make: {p.stderr.strip()}")


def on_term(*_):
    raise KeyboardInterrupt("SIGTERM")  # so that every run's teardown runs


def main(argv=None):
    signal.signal(signal.SIGTERM, on_term)
    a = parse(argv)
    ensure_model(a)
    out = a.out or tempfile.mkdtemp(prefix="lathe-chaos-")
    os.makedirs(out, exist_ok=True)
    total, faults, summary = check.Result(), collections.Counter(), []
    started = time.time()
    for i in range(a.runs):
        seed = a.seed + i
        rundir = os.path.join(out, f"seed{seed}")
        os.makedirs(rundir, exist_ok=True)
        log = Log(os.path.join(rundir, "driver.jsonl"))
        t = time.time()
        r = Run(a, seed, log, rundir)
        res = r.execute()
        log.close()
        total.violations += res.violations
        total.jobs += res.jobs
        total.outcomes.update(res.outcomes)
        total.events.update(res.events)
        faults.update(r.faults)
        line = {"seed": seed, "seconds": round(time.time() - t, 1), "jobs": res.jobs, "faults": dict(r.faults),
                "violations": len(res.violations), "dir": rundir}
        summary.append(line)
        print(f"chaos: run seed {seed}: {line['seconds']} s, {res.jobs} jobs, faults {dict(r.faults)}, "
              f"{len(res.violations)} violations", flush=True)
        for v in res.violations:
            print(f"chaos: seed {seed}: VIOLATION {v['kind']}: job {v['job']}: {v['detail']} "
                  f"[{', '.join(v['records'])}]", flush=True)
    with open(os.path.join(out, "campaign.jsonl"), "a") as f:
        for line in summary:
            f.write(json.dumps(line) + "\n")
    print(check.table(a.runs, faults, total))
    print(f"chaos: {a.runs} runs from seed {a.seed} in {time.time() - started:.0f} s; logs in {out}")
    if sum(faults.values()) < a.require_faults:
        print(f"chaos: FAIL: {sum(faults.values())} faults injected, fewer than --require-faults "
              f"{a.require_faults}")
        return 1
    return 1 if total.violations else 0


if __name__ == "__main__":
    sys.exit(main())
