#!/usr/bin/python3
"""chaos_check: the chaos checker (bench/chaos/check.py) catches every kind of violation it
names. A forged world — records as `lathe topic tail` prints them, a store of real files, the
driver's log — of four jobs (one clean, one resumed after a crash, one cancelled while running,
one rejected) passes clean; then each violation kind is planted in a copy of it, and the checker
must report exactly that kind, naming the job and the record. No broker or lathed needed.

usage: chaos_check.py"""
import copy
import hashlib
import os
import sys
import tempfile

ROOT = os.environ.get("LATHE_SOURCE_ROOT", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "chaos"))
import check  # noqa: E402

T0 = 1_800_000_000_000
TENANT = "tfo"
PASSED = []
# What a planted violation may bring with it: resuming from an older commit also loses steps.
ALSO = {"resume_not_newest": {"lost_steps"}}


def fail(msg):
    raise SystemExit(f"chaos_check: FAIL: {msg}")


def ok(cond, what):
    if not cond:
        fail(what)
    PASSED.append(what)
    print(f"chaos_check: ok: {what}")


class World:
    """Records by topic, a store of files under a temporary directory, and the driver's log."""

    def __init__(self, root):
        self.root = root
        self.recs = {t: [] for t in check.TOPICS}
        self.offsets = {}
        self.log = [{"ev": "run", "seed": 1, "tenants": [TENANT], "conf": {"kill_deadline_ms": 3000,
                     "lease_ms": 3000, "lease_margin_ms": 1000, "keep_checkpoints": 2, "slack_ms": 1000}},
                    {"ev": "gc_done"}]
        self.t = T0
        self.n = 0
        self.part = {}

    def put(self, topic, type_, partition=0, **rec):
        self.t += 100
        self.n += 1
        rec.setdefault("event_id", f"ev-{self.n}")
        rec.setdefault("occurred_at", self.t)
        rec.setdefault("tenant_id", TENANT)
        if topic == "control":  # a job's control records share its partition
            partition = self.part.setdefault(rec.get("job_id"), partition)
        off = self.offsets.get((topic, partition), 0)
        self.offsets[(topic, partition)] = off + 1
        m = {"topic": "f." + topic, "partition": partition, "offset": off, "timestamp": rec["occurred_at"],
             "key": rec.get("job_id"), "type": type_, "writer_version": 1, "record": rec}
        self.recs[topic].append(m)
        return m

    def obj(self, key, data):
        p = os.path.join(self.root, key)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)

    def ckpt(self, job, attempt, step, final=False, p=0):
        keys = [f"staging/{TENANT}/{job}/{attempt}/{step}/{n}" for n in ("adapter_model.safetensors", "state.bin")]
        h = hashlib.sha256()
        for k in keys:
            data = f"{k}:{step}".encode()
            self.obj(k, data)
            h.update(data)
        return self.put("control", "CheckpointCommitted", p, job_id=job, attempt=attempt, step=step, object_keys=keys,
                        sha256=h.hexdigest(), bytes=sum(len(f"{k}:{step}") for k in keys), final=final,
                        trigger="final" if final else "interval")

    def steps(self, job, attempt, first, last):
        for s in range(first, last + 1):
            self.put("progress", "StepCompleted", job_id=job, attempt=attempt, step=s, total_steps=40)

    def submit(self, job, p, interval=10):
        self.put("jobs", "JobSubmitted", job_id=job, hyperparameters={"checkpoint_interval": interval})
        self.log.append({"ev": "submit", "job": job, "tenant": TENANT, "acked": True, "status": 201})
        self.put("control", "JobAccepted", p, job_id=job)

    def publish(self, job, attempt, ckpt_ev, sha="aa"):
        key = f"tenants/{TENANT}/artifacts/{job}/adapter_model.safetensors"
        self.obj(key, b"artifact")
        return self.put("artifacts", "ArtifactPublished", job_id=job, attempt=attempt, checkpoint_event_id=ckpt_ev,
                        artifacts=[{"name": "adapter_model.safetensors", "key": key, "sha256": sha, "bytes": 8}])

    def store(self):
        return check.list_store(self.root, [TENANT])


def clean_world(root):
    w = World(root)
    # job-a: straight through to a publication.
    w.submit("job-a", 0)
    w.put("control", "JobDispatched", 0, job_id="job-a", attempt=1, resume_step=None)
    w.put("control", "AttemptStarted", 0, job_id="job-a", attempt=1)
    w.steps("job-a", 1, 1, 30)
    w.ckpt("job-a", 1, 10)
    w.ckpt("job-a", 1, 20)
    fa = w.ckpt("job-a", 1, 30, final=True)
    w.put("control", "JobCompleted", 0, job_id="job-a", attempt=1, step=30,
          checkpoint_event_id=fa["record"]["event_id"], checkpoint_sha256=fa["record"]["sha256"])
    w.publish("job-a", 1, fa["record"]["event_id"])
    # job-b: attempt 1 reaches step 25 and is lost; attempt 2 resumes from 20 (one interval).
    w.submit("job-b", 1)
    w.put("control", "JobDispatched", 1, job_id="job-b", attempt=1, resume_step=None)
    w.put("control", "AttemptStarted", 1, job_id="job-b", attempt=1)
    w.steps("job-b", 1, 1, 25)
    w.ckpt("job-b", 1, 10)
    w.ckpt("job-b", 1, 20)
    w.put("control", "AttemptStopped", 1, job_id="job-b", attempt=1, reason="lost", step=25, killed=False)
    w.put("control", "JobDispatched", 1, job_id="job-b", attempt=2, resume_step={"long": 20})
    w.put("control", "AttemptStarted", 1, job_id="job-b", attempt=2)
    w.steps("job-b", 2, 21, 40)
    w.ckpt("job-b", 2, 30)
    w.ckpt("job-b", 2, 30)  # the same commit again (a worker's retry across a broker restart): one checkpoint
    fb = w.ckpt("job-b", 2, 40, final=True)
    w.put("control", "JobCompleted", 1, job_id="job-b", attempt=2, step=40,
          checkpoint_event_id=fb["record"]["event_id"], checkpoint_sha256=fb["record"]["sha256"])
    w.publish("job-b", 2, fb["record"]["event_id"])
    # job-c: cancelled while running, stopped at once; its staging deleted.
    w.submit("job-c", 2)
    w.put("control", "JobDispatched", 2, job_id="job-c", attempt=1, resume_step=None)
    w.put("control", "AttemptStarted", 2, job_id="job-c", attempt=1)
    w.put("control", "CancelRequested", 2, job_id="job-c")
    w.put("control", "AttemptStopped", 2, job_id="job-c", attempt=1, reason="cancel", step=3, killed=False)
    w.put("control", "JobCancelled", 2, job_id="job-c", attempt=1)
    # job-d: rejected.
    w.submit("job-d", 3)
    w.put("control", "JobRejected", 3, job_id="job-d", code="invalid_field")
    w.log += [{"ev": "final_state", "job": j, "state": s} for j, s in
              (("job-a", "completed"), ("job-b", "completed"), ("job-c", "cancelled"), ("job-d", "rejected"))]
    w.log += [{"ev": "replay_digest", "digest": "d1"}, {"ev": "api_digest", "api": "api1", "digest": "d1"},
              {"ev": "api_digest", "api": "api2", "digest": "d1"}]
    # job-a's adapter through both samplers: the same greedy answer, a usage record each (counts,
    # never the prompt or the text); another tenant gets 404.
    for i, rid in ((1, "cmpl-1"), (2, "cmpl-2")):
        w.log.append({"ev": "sample", "job": "job-a", "tenant": TENANT, "sampler": f"sampler{i}", "status": 200,
                      "request_id": rid, "text": " 2021-03-05", "logprobs": [-0.1, -0.2],
                      "prompt": "date: March 5, 2021\niso:"})
        w.put("usage", "SamplingUsage", i - 1, request_id=rid, base_model="lathe-tiny", adapter_id="job-a",
              prompt_tokens=9, completion_tokens=8)
    w.log.append({"ev": "sample_probe", "job": "job-a", "owner": TENANT, "tenant": "tother", "status": 404})
    # job-a keeps its final and the two before it; job-b keeps 40, 30 and 20, 10 of attempt 1 goes.
    for k in list(w.store()):
        if k.startswith(f"staging/{TENANT}/job-b/1/10/"):
            os.remove(os.path.join(root, k))
    return w


def find(w, type_, job, **match):
    for t in check.TOPICS:
        for m in w.recs[t]:
            r = m["record"]
            if m["type"] == type_ and r.get("job_id") == job and all(r.get(k) == v for k, v in match.items()):
                return m
    fail(f"fixture has no {type_} of {job} {match}")


def drop(w, m):
    for t in check.TOPICS:
        if m in w.recs[t]:
            w.recs[t].remove(m)


def plant_forgotten(w):
    w.log.append({"ev": "submit", "job": "job-z", "tenant": TENANT, "acked": True, "status": 201})
    return "job-z"


def plant_not_terminal(w):
    drop(w, find(w, "JobCompleted", "job-a"))
    drop(w, find(w, "ArtifactPublished", "job-a"))
    return "job-a"


def plant_state_mismatch(w):
    next(e for e in w.log if e.get("ev") == "final_state" and e["job"] == "job-a")["state"] = "failed"
    return "job-a"


def plant_published_not_completed(w):
    w.publish("job-c", 1, "ev-nothing")
    return "job-c"


def plant_published_fenced(w):
    drop(w, find(w, "ArtifactPublished", "job-b"))
    c20 = find(w, "CheckpointCommitted", "job-b", attempt=1, step=20)
    w.publish("job-b", 1, c20["record"]["event_id"])
    return "job-b"


def plant_multiple_publications(w):
    fa = find(w, "CheckpointCommitted", "job-a", final=True)
    w.publish("job-a", 1, fa["record"]["event_id"], sha="bb")
    return "job-a"


def plant_published_not_final(w):
    drop(w, find(w, "ArtifactPublished", "job-a"))
    c20 = find(w, "CheckpointCommitted", "job-a", step=20)
    w.publish("job-a", 1, c20["record"]["event_id"])
    return "job-a"


def plant_checkpoint_mismatch(w):
    fa = find(w, "CheckpointCommitted", "job-a", final=True)
    w.obj(fa["record"]["object_keys"][0], b"torn write")
    return "job-a"


def plant_artifact_missing(w):
    os.remove(os.path.join(w.root, f"tenants/{TENANT}/artifacts/job-b/adapter_model.safetensors"))
    return "job-b"


def plant_artifact_corrupt(w):
    w.log.append({"ev": "download", "job": "job-a", "ok": False, "detail": "adapter_model.safetensors: sha256 differs"})
    return "job-a"


def plant_lost_steps(w):
    stop = find(w, "AttemptStopped", "job-b", attempt=1)
    w.steps("job-b", 1, 26, 35)  # attempt 1 went 15 steps past its newest commit before it was lost
    for m in w.recs["progress"][-10:]:
        m["record"]["occurred_at"] = stop["record"]["occurred_at"] - 1
    return "job-b"


def plant_resume_not_newest(w):
    find(w, "JobDispatched", "job-b", attempt=2)["record"]["resume_step"] = {"long": 10}
    return "job-b"


def plant_digest_mismatch(w):
    next(e for e in w.log if e.get("ev") == "api_digest" and e["api"] == "api2")["digest"] = "d2"
    return "api2"


def plant_cancel_slow(w):
    stop = find(w, "AttemptStopped", "job-c")
    stop["record"]["occurred_at"] += 60000
    return "job-c"


def plant_staged_orphan(w):
    w.obj(f"staging/{TENANT}/job-c/1/2/state.bin", b"left behind")
    w.obj(f"sessions/{TENANT}/job-c/results/7", b"a result kept past its session")
    return "job-c"


def plant_sample_unavailable(w):
    w.log.append({"ev": "sample", "job": "job-b", "tenant": TENANT, "sampler": "sampler2", "status": 503,
                  "detail": "starting"})
    return "job-b"


def plant_sample_mismatch(w):
    next(e for e in w.log if e.get("ev") == "sample" and e["sampler"] == "sampler2")["logprobs"] = [-0.1, -0.3]
    return "job-a"


def plant_sample_wrong_tenant(w):
    next(e for e in w.log if e.get("ev") == "sample_probe")["status"] = 200
    return "job-a"


def plant_usage_missing(w):
    drop(w, next(m for m in w.recs["usage"] if m["record"]["request_id"] == "cmpl-2"))
    return "job-a"


def plant_usage_leak(w):
    w.recs["usage"][0]["record"]["note"] = "asked: date: March 5, 2021\niso:"
    return "cmpl-1"


def plant_not_drained(w):
    w.log.append({"ev": "not_drained", "jobs": ["job-q"], "detail": "1 job not terminal"})
    return "job-q"


def plant_fleet_unhealthy(w):
    w.log.append({"ev": "unhealthy", "proc": "w2", "detail": "exited -9 after the run"})
    return "w2"


def plant_unfolded_resume(w):
    w.log.append({"ev": "unfolded_resume", "proc": "pub1", "job": "job-a",
                  "detail": "job job-a: attempt 2 resumes from checkpoint commit e-9 (step 80), which this "
                            "publisher never folded (its newest: e-7)"})
    return "job-a"


def driver_reads_publisher_logs(tmp):
    """The driver finds a publisher's word of a resume it never folded, in every start of its log."""
    import run
    path = os.path.join(tmp, "pub1.log")
    with open(path, "w") as f:
        f.write("=== chaos: start 1 at 1\nlathed publisher: job job-7: attempt 2 resumes from checkpoint commit "
                "e-9 (step 80), which this publisher never folded (its newest: e-7); that step's ...\n"
                "=== chaos: start 2 at 2\nlathed publisher: job job-7: checkpoint commit (attempt 2, step 100)\n")
    got = run.unfolded_resumes(path)
    ok([j for j, _ in got] == ["job-7"], f"the driver reads the publisher's line from its first start: {got}")
    ok(run.unfolded_resumes(os.path.join(tmp, "none.log")) == [], "a publisher without a log says nothing")


def driver_kinds(tmp):
    """The driver injects broker and store faults exactly when ops/stack has the subcommands."""
    import run
    for name, body, want in (
            ("old", "echo usage >&2; exit 2", set()),
            ("new", 'case "$1 $2" in "broker list") echo "1 running";; help\ *) echo "  ops/stack s3 stop";; '
                    '*) exit 2;; esac', {"broker_restart", "s3_restart"})):
        script = os.path.join(tmp, f"stack-{name}")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\n{body}\n")
        os.chmod(script, 0o755)
        os.environ["LATHE_CHAOS_STACK"] = script
        kinds, skipped = run.available_kinds(False)
        got = set(kinds) & {"broker_restart", "s3_restart"}
        ok(got == want and "partition_worker" in skipped and set(kinds) >= {"kill_process", "kill_executor"},
           f"an ops/stack {'with' if want else 'without'} broker/s3 subcommands: kinds {sorted(got)}, "
           f"skipped {sorted(skipped)}")
    del os.environ["LATHE_CHAOS_STACK"]


def main():
    with tempfile.TemporaryDirectory(prefix="chaos-check-") as tmp:
        clean = clean_world(os.path.join(tmp, "clean"))
        res = check.check_records(clean.recs, clean.log, clean.store())
        ok(not res.violations, f"the clean world passes: {res.violations}")
        ok(res.outcomes == {"completed": 2, "cancelled": 1, "rejected": 1}, f"its outcomes: {dict(res.outcomes)}")
        for kind in check.KINDS:
            plant = globals()[f"plant_{kind}"]
            root = os.path.join(tmp, kind)
            w = clean_world(root)
            job = plant(w)
            res = check.check_records(w.recs, w.log, w.store())
            kinds = sorted({v["kind"] for v in res.violations})
            hit = [v for v in res.violations if v["kind"] == kind and v["job"].startswith(job)]
            also = ALSO.get(kind, set())
            ok(hit and set(kinds) - also == {kind}, f"{kind} planted on {job} is reported (alone, or with "
               f"{sorted(also)}): {kinds} "
               f"{hit[0]['detail'] if hit else ''} {hit[0]['records'] if hit else ''}")
            if hit and kind not in ("forgotten", "digest_mismatch", "not_drained", "fleet_unhealthy", "unfolded_resume",
                                    "checkpoint_mismatch", "artifact_missing", "staged_orphan",
                                    "sample_unavailable", "sample_mismatch", "sample_wrong_tenant", "usage_missing"):
                ok(hit[0]["records"], f"{kind} names the records ({', '.join(hit[0]['records'])})")
        driver_kinds(tmp)
        driver_reads_publisher_logs(tmp)
        table = check.table(1, {"kill_process": 2}, res)
        ok("violations by kind:" in table and "kill_process" in table, "the table has faults and violations by kind")
    print(f"chaos_check: {len(PASSED)} checks passed")


if __name__ == "__main__":
    main()
