"""`lathe sim --json` prints one JSON object that scripts can read, with the same figures as the
table: on the heavy-tenant trace Lathe's policy is fairer than FIFO (Jain's index per class).
Then the simulator's own behaviour: event-driven runs equal the tick-based ones on the bundled
traces (exactly on heavy.csv; on mixed.csv FIFO exactly and Lathe within tolerance, since the
tick delayed each aging or preemption decision by up to 5 s); multi-day jobs on a full fleet are
not a stall; a real deadlock names the job; an out-of-order line is refused naming it; jobs
larger than a worker run as multi-worker gangs, and larger than a node group are counted, not
fatal; `lathe sim gen` is deterministic and matches its
mix.

usage: sim_json.py PATH/TO/lathe   (LATHE_SOURCE_ROOT: the repository)"""
import collections
import csv
import io
import json
import os
import subprocess
import sys
import tempfile

lathe = sys.argv[1]
root = os.environ.get("LATHE_SOURCE_ROOT", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
trace = os.path.join(root, "bench", "traces", "heavy.csv")
out = subprocess.run([lathe, "sim", trace, "--workers", "4", "--slots", "4", "--json"], capture_output=True, text=True)
if out.returncode != 0:
    sys.exit(f"sim_json: lathe sim failed ({out.returncode}): {out.stderr}")
d = json.loads(out.stdout)
pol = {p["policy"]: p for p in d["policies"]}
if set(pol) != {"lathe", "fifo", "las"}:
    sys.exit(f"sim_json: policies {sorted(pol)}, wanted lathe, fifo and las")
if d["jobs"] <= 0 or not pol["lathe"]["rows"]:
    sys.exit("sim_json: no jobs or no rows")
for p in pol.values():
    for row in p["rows"]:
        for k in ("tenant", "class", "weight", "jobs", "wait_p50_s", "wait_p99_s", "share", "entitlement",
                  "gpu_hours", "cold_loads"):
            if k not in row:
                sys.exit(f"sim_json: row without {k}: {row}")
    for k in ("gpu_hours", "reserved_idle_slot_hours", "fragmented_slots_mean"):
        if k not in p:
            sys.exit(f"sim_json: {p['policy']} without {k}")
    if sum(r["cold_loads"] for r in p["rows"]) != p["cold_loads"]:
        sys.exit(f"sim_json: {p['policy']}: the rows' cold loads do not add up to {p['cold_loads']}")
    # heavy.csv: 1-GPU jobs, never preempted under these policies, so each ran its duration plus
    # the 60 s cold load when its worker lacked the model
    with open(trace) as f:
        work = sum(int(x["gpus"]) * float(x["duration_s"]) for x in csv.DictReader(f))
    want = (work + 60 * p["cold_loads"]) / 3600
    if p["preemptions"] == 0 and abs(p["gpu_hours"] - want) > 1e-3:
        sys.exit(f"sim_json: {p['policy']}: {p['gpu_hours']} GPU-hours, wanted {want}")
    if abs(sum(r["gpu_hours"] for r in p["rows"]) - p["gpu_hours"]) > 1e-3:
        sys.exit(f"sim_json: {p['policy']}: the rows' GPU-hours do not add up")
jl, jf = pol["lathe"]["jain"]["standard"], pol["fifo"]["jain"]["standard"]
if not jl > jf + 0.1:
    sys.exit(f"sim_json: Jain (standard) lathe {jl} is not above fifo {jf} + 0.1")
bad = subprocess.run([lathe, "sim", trace, "--json", "--policy", "nope"], capture_output=True, text=True)
if bad.returncode != 2 or "--policy" not in bad.stderr:
    sys.exit(f"sim_json: a bad --policy must exit 2 naming it, got {bad.returncode}: {bad.stderr}")


def sim(path, *args, ok=True):
    r = subprocess.run([lathe, "sim", path, "--json", *args], capture_output=True, text=True)
    if ok and r.returncode != 0:
        sys.exit(f"sim_json: lathe sim {path} {args} failed ({r.returncode}): {r.stderr}")
    return json.loads(r.stdout) if r.returncode == 0 else r


def rounded(x):  # the integrals add up over other instants: equal to 4 decimals
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    return round(x, 4) if isinstance(x, float) else x


def headline(p):
    return rounded({k: p[k] for k in ("utilisation", "makespan_s", "dispatches", "preemptions", "completed", "jain", "class_waits")})


# event-driven == tick-based (the simulator before it was event-driven)
for name, fleet in (("heavy", ["--workers", "4", "--slots", "4"]), ("heavy", []), ("mixed", [])):
    path = os.path.join(root, "bench", "traces", name + ".csv")
    ev, tk = sim(path, "--policy", "both", *fleet), sim(path, "--policy", "both", "--tick", "5", *fleet)
    for pe, pt in zip(ev["policies"], tk["policies"]):
        he, ht = headline(pe), headline(pt)
        if name == "heavy" or pe["policy"] == "fifo":
            if he != ht:
                sys.exit(f"sim_json: {name} {pe['policy']}: event-driven {he} != tick-based {ht}")
        else:
            if pe["completed"] != pt["completed"] or abs(pe["utilisation"] - pt["utilisation"]) > 0.02 or \
                    abs(pe["makespan_s"] / pt["makespan_s"] - 1) > 0.02 or pe["jain"]["production"] < 0.98:
                sys.exit(f"sim_json: {name} lathe: event-driven {he} too far from tick-based {ht}")
        if pe["decide_calls"] > pt["decide_calls"] * 1.5:
            sys.exit(f"sim_json: {name}: {pe['decide_calls']} decide calls event-driven vs {pt['decide_calls']}")

tmp = tempfile.mkdtemp(prefix="sim_json.")
HDR = "arrival_s,tenant,class,gpus,duration_s,base_model\n"


def trace(name, rows):
    p = os.path.join(tmp, name)
    with open(p, "w") as f:
        f.write(HDR + "".join(r + "\n" for r in rows))
    return p


# multi-day jobs filling the fleet, then more work queued behind them for days: not a stall
rows = [f"{i},a,standard,8,{10 * 86400},m" for i in range(4)] + [f"{100 + i},b,standard,1,600,m" for i in range(20)]
d = sim(trace("days.csv", rows), "--workers", "4", "--slots", "8")
for p in d["policies"]:
    if p["completed"] != 24 or p["makespan_s"] < 10 * 86400:
        sys.exit(f"sim_json: multi-day trace: {p['policy']} completed {p['completed']}, makespan {p['makespan_s']}")

# a real deadlock: the tenant's running-slot quota is below the job's GPUs, nothing else runs
r = sim(trace("dead.csv", ["0,a,standard,1,60,m", "5,q,standard,4,60,m"]), "--policy", "lathe", "--tenant", "q:1:2", ok=False)
if r.returncode != 1 or "deadlock" not in r.stderr or "trace line 3" not in r.stderr or "quota" not in r.stderr:
    sys.exit(f"sim_json: the deadlock must be reported naming trace line 3 and the quota, got {r.returncode}: {r.stderr}")

# larger than a worker: a multi-worker gang, run by every policy; larger than a node group:
# counted and named, the rest runs
big = trace("big.csv", ["0,a,standard,1,60,m", "1,a,standard,16,60,m", "2,a,standard,2,60,m"])
d = sim(big, "--slots", "8")
for p in d["policies"]:
    if p["refused_by_size"] != 0 or p["completed"] != 3 or p["multi_worker_gangs_started"] != 1 or \
            p["multi_worker_gangs_finished"] != 1:
        sys.exit(f"sim_json: a 16-GPU job on 8-slot workers must run on two: {p['policy']} {p}")
d = sim(big, "--slots", "8", "--workers-per-group", "1")
for p in d["policies"]:
    if p["refused_by_size"] != 1 or p["refused_first_line"] != 3 or p["completed"] != 2:
        sys.exit(f"sim_json: a 16-GPU job on 8-slot workers in groups of one: {p['policy']} {p}")

# fragmentation and reserved idle slots, on one 4-slot worker: a's 1-GPU job runs 1000 s after a
# 60 s cold load, b's 4-GPU gang waits behind it with 3 slots free for 1060 s, then runs 100 s.
# FIFO leaves the 3 slots fragmented all along; Lathe reserves the worker for the gang at some
# point, and from then on they are reserved idle instead: the two add up to 3 x 1060 slot-s.
d = sim(trace("gang.csv", ["0,a,standard,1,1000,m", "0,b,standard,4,100,m"]), "--workers", "1", "--slots", "4")
pol = {p["policy"]: p for p in d["policies"]}
for name, p in pol.items():
    rows = {r["tenant"]: r for r in p["rows"]}
    if p["makespan_s"] != 1160 or abs(p["gpu_hours"] - 1460 / 3600) > 1e-4 or \
            abs(rows["a"]["gpu_hours"] - 1060 / 3600) > 1e-4 or \
            rows["a"]["cold_loads"] != 1 or rows["b"]["cold_loads"] != 0:
        sys.exit(f"sim_json: gang trace {name}: GPU-hours or cold loads wrong: {p}")
    idle = p["reserved_idle_slot_hours"] * 3600 + p["fragmented_slots_mean"] * 1160
    if abs(idle - 3 * 1060) > 0.5:
        sys.exit(f"sim_json: gang trace {name}: reserved idle + fragmented = {idle} slot-s, wanted 3180")
if pol["fifo"]["reserved_idle_slot_hours"] != 0 or pol["lathe"]["reserved_idle_slot_hours"] <= 0:
    sys.exit(f"sim_json: gang trace: FIFO reserves nothing, Lathe reserves the worker: {pol}")

# an out-of-order line is refused, naming it
r = sim(trace("order.csv", ["10,a,standard,1,60,m", "5,a,standard,1,60,m"]), ok=False)
if r.returncode != 1 or "line 3" not in r.stderr or "sorted" not in r.stderr:
    sys.exit(f"sim_json: an out-of-order line must be refused naming line 3, got {r.returncode}: {r.stderr}")

# lathe sim gen: the same bytes for the same seed, another for another; the requested mix
def gen(*args):
    r = subprocess.run([lathe, "sim", "gen", *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sim_json: lathe sim gen {args} failed: {r.stderr}")
    return r.stdout


a, b, c = gen("--jobs", "20000", "--seed", "3"), gen("--jobs", "20000", "--seed", "3"), gen("--jobs", "20000", "--seed", "4")
if a != b or a == c:
    sys.exit("sim_json: lathe sim gen is not deterministic in its seed")
rows = list(csv.DictReader(io.StringIO(a)))
n = len(rows)
cls = collections.Counter(x["class"] for x in rows)
gpus = collections.Counter(int(x["gpus"]) for x in rows)
want_cls = {"production": 0.15, "standard": 0.60, "preemptible": 0.25}
want_gpus = {1: 0.687, 2: 0.03, 4: 0.134, 8: 0.126, 16: 0.017, 32: 0.006}
for k, v in want_cls.items():
    if abs(cls[k] / n - v) > 0.015:
        sys.exit(f"sim_json: gen class {k}: {cls[k] / n:.3f}, wanted {v}")
for k, v in want_gpus.items():
    if abs(gpus[k] / n - v) > max(0.01, v * 0.3):
        sys.exit(f"sim_json: gen {k} GPUs: {gpus[k] / n:.4f}, wanted {v}")
dur = sorted(float(x["duration_s"]) for x in rows)
for q, v in ((0.1, 18 * 60), (0.5, 4.1 * 3600), (0.9, 3.8 * 86400), (0.99, 35 * 86400)):
    got = dur[int(q * n)]
    if not v / 1.25 < got < v * 1.25:
        sys.exit(f"sim_json: gen duration p{int(q * 100)} {got:.0f} s, wanted ~{v:.0f} s")
arr = [float(x["arrival_s"]) for x in rows]
per_tenant = collections.Counter(x["tenant"] for x in rows).values()
if arr != sorted(arr) or arr[-1] > 125 * 86400 or min(per_tenant) < 3 or max(per_tenant) > 2000:
    sys.exit("sim_json: gen arrivals unsorted, past 125 days, or a tenant outside 3..2000 jobs")
print(f"sim_json: OK (Jain standard: lathe {jl:.3f}, fifo {jf:.3f})")
