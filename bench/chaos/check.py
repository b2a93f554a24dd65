#!/usr/bin/python3
"""bench/chaos/check.py: after a chaos run, proves Lathe's invariants (docs/DESIGN.md §4) from
the whole log, the object store and the driver's own log of what it was acknowledged.

Reads every Lathe topic of a prefix from the beginning (`lathe topic tail`, decoded JSON), lists
the object store's files of the run's tenants (S3Proxy's filesystem backend keeps one plain file
per object, so the store is read where it lies: LATHE_CHAOS_STORE_DIR, by default the local
stack's .stack/s3/data/<bucket>), and the driver's JSONL (bench/chaos/run.py). Every check is a
pure function of those three inputs (`check_records`), so tests feed it forged record sets
(tests/chaos_check.py).

Checks and the violation kind each reports (every violation names the job and the records,
as topic/partition@offset):
  forgotten            an acknowledged submission has no JobSubmitted, or no record in control
  not_terminal         a job of the log (or acknowledged) never reached a terminal state
  state_mismatch       the API's answer for a job differs from the terminal state the log decides
  published_not_completed  an ArtifactPublished for a job that ended cancelled, failed, rejected
  published_fenced     a publication from an attempt older than the job's current one, or of a
                       checkpoint committed by a fenced attempt
  multiple_publications    two publications of one job with different checkpoints or contents
  published_not_final  the publication is not of the final checkpoint the completion names
  checkpoint_mismatch  the final checkpoint's stored objects are missing or do not hash to its commit
  artifact_missing     a published artifact's object is not in the store
  artifact_corrupt     `lathe jobs download` of a completed job failed (an artifact's bytes do not
                       hash to what its ArtifactPublished says, or it is not served)
  lost_steps           an attempt resumed more than one checkpoint interval behind the steps its
                       predecessors reached
  resume_not_newest    an attempt resumed from other than the newest live commit before it
  digest_mismatch      a live API's state digest differs from `lathe admin replay`'s
  cancel_slow          cancel -> attempt stopped took longer than the kill deadline (plus the lease
                       and margin when a fault may have taken the worker)
  staged_orphan        a staging object after GC that no live retention owns, or a call or result
                       of a session that ended
  sample_unavailable   a completed job's adapter did not answer 200 on a sampler at the end
  sample_mismatch      two samplers answered one greedy, seeded request with other tokens or logprobs
  sample_wrong_tenant  a tenant asking for another tenant's adapter got anything but 404
  usage_missing        an answered sampling request has no SamplingUsage record of its tenant
  usage_leak           a SamplingUsage record holds the prompt or the text it answered
  not_drained          the driver gave up waiting for the workload to drain
  fleet_unhealthy      a process of the fleet did not come back healthy at the end
  unfolded_resume      a publisher saw a dispatch resume from a checkpoint commit it never folded
                       (a record its consumer or fold missed; it keeps that checkpoint and says so)

usage: check.py --prefix P --log DRIVER.jsonl [--lathe PATH] [--store-dir DIR] [--records FILE] [--json]
Exits 0 when there are no violations, 1 otherwise (the table says which)."""
import argparse
import collections
import hashlib
import json
import os
import subprocess
import sys
import threading

TOPICS = ("jobs", "control", "progress", "artifacts", "deadletter", "usage")
TERMINAL = {"JobCompleted": "completed", "JobFailed": "failed", "JobCancelled": "cancelled",
            "JobRejected": "rejected"}
KINDS = ("forgotten", "not_terminal", "state_mismatch", "published_not_completed", "published_fenced",
         "multiple_publications", "published_not_final", "checkpoint_mismatch", "artifact_missing", "artifact_corrupt",
         "lost_steps", "resume_not_newest", "digest_mismatch", "cancel_slow", "staged_orphan",
         "sample_unavailable", "sample_mismatch", "sample_wrong_tenant", "usage_missing", "usage_leak",
         "not_drained", "fleet_unhealthy", "unfolded_resume")


def unwrap(v):
    """An Avro union value as JSON gives it ({"long": 5}) -> 5; anything else as it is."""
    if isinstance(v, dict) and len(v) == 1:
        k = next(iter(v))
        if k in ("long", "int", "string", "double", "float", "boolean", "bytes"):
            return v[k]
    return v


def where(m):
    return f"{m.get('topic', '?')}/{m.get('partition', '?')}@{m.get('offset', '?')}"


class Result:
    """Violations by kind, each with the job and the records it names; and what was seen."""

    def __init__(self):
        self.violations = []
        self.jobs = 0
        self.outcomes = collections.Counter()
        self.events = collections.Counter()  # what the workload went through: preemptions, resumes...

    def add(self, kind, job, detail, records=()):
        assert kind in KINDS, kind
        self.violations.append({"kind": kind, "job": job, "detail": detail,
                                "records": [where(m) if isinstance(m, dict) else m for m in records]})


# ---------------------------------------------------------------- the shadow fold

class Job:
    """What the checker folds of one job, independently of src/lib/lt_job.c (so a bug there is
    not hidden by reusing it): the records in control-partition order."""

    def __init__(self, jid):
        self.id = jid
        self.submitted = None        # the JobSubmitted message
        self.tenant = None
        self.hp = {}
        self.attempt = 0             # newest dispatched attempt
        self.stopped = set()         # attempts whose AttemptStopped applied
        self.cancel = None           # the first CancelRequested message
        self.outcome = None          # completed | failed | cancelled | rejected
        self.terminal = None         # the message that decided it
        self.commits = {}            # event_id -> (message, fenced)
        self.live_commits = []       # applied CheckpointCommitted messages, in order
        self.dispatches = []         # (message, newest live commit before it, newest at the last stop)
        self.at_stop = {}            # attempt -> newest live commit when its AttemptStopped applied
        self.starts = {}             # attempt -> AttemptStarted message
        self.stops = {}              # attempt -> AttemptStopped message (applied)
        self.control = []            # every control message of the job
        self.steps = collections.defaultdict(list)  # attempt -> [(occurred_at, step)] of StepCompleted
        self.pubs = []               # ArtifactPublished messages


def fold(jobs_msgs, control_msgs):
    """Folds lathe.jobs and lathe.control into Jobs by id (control in partition/offset order)."""
    jobs = {}
    for m in jobs_msgs:
        r = m.get("record") or {}
        if m.get("type") != "JobSubmitted":
            continue
        j = jobs.setdefault(r["job_id"], Job(r["job_id"]))
        if j.submitted is None:
            j.submitted, j.tenant = m, r.get("tenant_id")
            j.hp = r.get("hyperparameters") or {}
    for m in sorted(control_msgs, key=lambda m: (m.get("partition", 0), m.get("offset", 0))):
        r = m.get("record") or {}
        jid = r.get("job_id") or m.get("key")
        if not jid:
            continue
        j = jobs.setdefault(jid, Job(jid))
        j.control.append(m)
        t, a = m.get("type"), unwrap(r.get("attempt"))
        done = j.outcome is not None
        if t == "JobRejected" and not done and j.attempt == 0:
            j.outcome, j.terminal = "rejected", m
        elif t == "JobDispatched":
            if not done and a > j.attempt:
                # The scheduler decides a redispatch from what it folded by the previous attempt's
                # stop; a commit of that attempt may land between the stop and the dispatch.
                j.dispatches.append((m, j.live_commits[-1] if j.live_commits else None,
                                     j.at_stop.get(j.attempt, j.live_commits[-1] if j.live_commits else None)))
                j.attempt = a
        elif t == "AttemptStarted":
            if a == j.attempt and a not in j.starts:
                j.starts[a] = m
        elif t == "CancelRequested":
            if not done and j.cancel is None:
                j.cancel = m
        elif t == "CheckpointCommitted":  # as lt_job.c: the current attempt's, stopped or not
            fenced = done or a != j.attempt or j.attempt == 0
            j.commits[r["event_id"]] = (m, fenced)
            if not fenced:
                j.live_commits.append(m)
        elif t == "AttemptStopped":
            if not done and a == j.attempt and a not in j.stopped:
                j.stopped.add(a)
                j.stops[a] = m
                j.at_stop[a] = j.live_commits[-1] if j.live_commits else None
        elif t == "JobCompleted":
            if not done and a == j.attempt:
                j.outcome, j.terminal = ("cancelled" if j.cancel else "completed"), m
        elif t in ("JobFailed", "JobCancelled"):
            if not done:
                j.outcome, j.terminal = TERMINAL[t], m
    return jobs


# ---------------------------------------------------------------- the checks

def check_records(recs, log, store, res=None):
    """Every check over recs (topic base name -> list of `lathe topic tail` messages), log (the
    driver's JSONL as a list of dicts) and store (object key -> {"size", "sha256", "mtime"} or a
    callable giving the bytes' sha256 for a list of keys). Returns a Result."""
    res = res or Result()
    run = next((e for e in log if e.get("ev") == "run"), {})
    conf = run.get("conf", {})
    jobs = fold(recs.get("jobs", []), recs.get("control", []))
    for m in recs.get("progress", []):
        r = m.get("record") or {}
        if m.get("type") == "StepCompleted" and r.get("job_id") in jobs:
            jobs[r["job_id"]].steps[r.get("attempt", 0)].append((r.get("occurred_at", 0), unwrap(r.get("step")) or 0))
    for m in recs.get("artifacts", []):
        r = m.get("record") or {}
        if m.get("type") == "ArtifactPublished":
            jobs.setdefault(r["job_id"], Job(r["job_id"])).pubs.append(m)
    res.jobs += len(jobs)
    for m in recs.get("control", []):
        t = m.get("type")
        if t in ("PreemptRequested", "CancelRequested", "AttemptStopped"):
            res.events[{"PreemptRequested": "preemptions", "CancelRequested": "cancels"}.get(
                t, f"stops ({unwrap(m['record'].get('reason'))})")] += 1
        elif t == "JobDispatched" and m["record"].get("attempt", 1) > 1:
            res.events["redispatches"] += 1
    res.events["sessions"] += sum(1 for jid in jobs if jid.startswith("ses-"))
    acked = {e["job"]: e for e in log if e.get("ev") == "submit" and e.get("acked")}
    api_states = {e["job"]: e["state"] for e in log if e.get("ev") == "final_state"}
    for jid, e in acked.items():
        j = jobs.get(jid)
        if j is None or j.submitted is None:
            res.add("forgotten", jid, f"acknowledged at {e.get('t')} ms ({e.get('status')}) but no JobSubmitted")
        elif not j.control:
            res.add("forgotten", jid, "its JobSubmitted has no record in lathe.control", [j.submitted])
    for jid, j in sorted(jobs.items()):
        if j.submitted is None and not j.control:
            continue
        res.outcomes[j.outcome or "none"] += 1
        if j.outcome is None:
            last = j.control[-1:] or [j.submitted]
            res.add("not_terminal", jid, f"no terminal record (newest attempt {j.attempt})", last)
        if jid in api_states and j.outcome and api_states[jid] != j.outcome:
            res.add("state_mismatch", jid, f"the API says {api_states[jid]}, the log decides {j.outcome}",
                    [j.terminal])
        check_publication(j, store, res)
        check_resumes(j, res)
        check_cancel(j, conf, log, res)
    check_staging(jobs, store, conf, run, log, res)
    check_digests(log, res)
    check_sampling(recs.get("usage", []), log, res)
    for e in log:
        if e.get("ev") == "download" and not e.get("ok"):
            res.add("artifact_corrupt", e.get("job", "?"), f"lathe jobs download: {e.get('detail', '')}",
                    jobs[e["job"]].pubs if e.get("job") in jobs else [])
        if e.get("ev") == "not_drained":
            res.add("not_drained", ",".join(e.get("jobs", [])[:8]), e.get("detail", "workload did not drain"))
        if e.get("ev") == "unhealthy":
            res.add("fleet_unhealthy", e.get("proc", "?"), e.get("detail", ""))
        if e.get("ev") == "unfolded_resume":
            res.add("unfolded_resume", e.get("job", "?"), f"{e.get('proc', '?')}: {e.get('detail', '')}")
    return res


def check_publication(j, store, res):
    """Publish after commit, never for a job that did not complete, never from a fenced attempt,
    at most once, of the final committed checkpoint; and the bytes are where the records say."""
    if not j.pubs:
        return
    if j.outcome != "completed":
        res.add("published_not_completed", j.id, f"published but the job ended {j.outcome}",
                j.pubs + ([j.terminal] if j.terminal else []))
        return
    done = j.terminal["record"]
    contents = {(p["record"].get("checkpoint_event_id"),
                 tuple(sorted((x["name"], x["sha256"]) for x in p["record"].get("artifacts", []))))
                for p in j.pubs}
    if len(contents) > 1:
        res.add("multiple_publications", j.id, f"{len(contents)} different publications", j.pubs)
    for p in j.pubs:
        r = p["record"]
        ck = r.get("checkpoint_event_id")
        commit = j.commits.get(ck)
        if r.get("attempt") != done.get("attempt") or (commit and commit[1]):
            res.add("published_fenced", j.id,
                    f"published attempt {r.get('attempt')} (checkpoint {ck}); the completion is attempt "
                    f"{done.get('attempt')}", [p, j.terminal] + ([commit[0]] if commit else []))
        elif ck != done.get("checkpoint_event_id") or not commit or not commit[0]["record"].get("final"):
            res.add("published_not_final", j.id,
                    f"published checkpoint {ck}, the completion names {done.get('checkpoint_event_id')}",
                    [p, j.terminal] + ([commit[0]] if commit else []))
        for a in r.get("artifacts", []):
            if store is not None and a.get("key") not in store:
                res.add("artifact_missing", j.id, f"{a.get('name')} at {a.get('key')} is not in the store", [p])
    commit = j.commits.get(done.get("checkpoint_event_id"))
    if commit and store is not None:
        c = commit[0]["record"]
        keys = c.get("object_keys", [])
        missing = [k for k in keys if k not in store]
        if missing:
            res.add("checkpoint_mismatch", j.id, f"final checkpoint objects missing: {missing[:3]}", [commit[0]])
        else:
            size = sum(store[k]["size"] for k in keys)
            sha = store_sha(store, keys)
            if size != c.get("bytes") or (sha is not None and sha != c.get("sha256")):
                res.add("checkpoint_mismatch", j.id, f"final checkpoint stored {size} B sha {sha}, "
                        f"committed {c.get('bytes')} B sha {c.get('sha256')}", [commit[0]])


def store_sha(store, keys):
    """SHA-256 over the stored bytes of keys concatenated (None when the listing has no paths)."""
    h = hashlib.sha256()
    for k in keys:
        path = store[k].get("path")
        if not path:
            return store[k].get("sha256") if len(keys) == 1 else None
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def check_resumes(j, res):
    """Each attempt after the first resumes from the newest live commit before its dispatch, and
    loses at most one checkpoint interval of the steps its predecessors reached."""
    interval = unwrap(j.hp.get("checkpoint_interval")) or 0
    reached = 0
    for m, newest, at_stop in j.dispatches:
        r = m["record"]
        a = r.get("attempt")
        resume = unwrap(r.get("resume_step"))
        want = newest["record"]["step"] if newest else None
        low = at_stop["record"]["step"] if at_stop else None
        if a > 1 and not (low or 0) <= (resume or 0) <= (want or 0):
            res.add("resume_not_newest", j.id, f"attempt {a} resumes from {resume}, newest commit is {want} "
                    f"({low} at the stop)", [m] + ([newest] if newest else []))
        if a > 1 and interval > 0 and reached - (resume or 0) > interval:
            res.add("lost_steps", j.id, f"attempt {a} resumes at step {resume or 0} after step {reached} was "
                    f"reached: {reached - (resume or 0)} steps lost > interval {interval}", [m])
        reached = max(reached, reached_by(j, a))


def reached_by(j, a):
    """The highest step attempt a completed before its stop was recorded: what a crash could
    lose. Steps a fenced attempt makes after it was declared lost count for nothing."""
    stop = j.stops.get(a)
    until = stop["record"]["occurred_at"] if stop else float("inf")
    return max((s for t, s in j.steps.get(a, []) if t <= until), default=0)


def fault_windows(log):
    """[start, end] of each fault: from its injection to its restoration (a restart, SIGCONT, a
    heal, a server answering again), or the injection alone for a fault nothing restores."""
    out, open_ = [], {}
    for e in log:
        if e.get("ev") == "fault":
            open_.setdefault(e.get("target"), []).append(e["t"])
            if e.get("kind") == "kill_executor":
                out.append((e["t"], e["t"]))
        elif e.get("ev") == "restored":
            tgt = e.get("target")
            key = next((k for k in open_ if k == tgt or (tgt == "partition" and k.startswith("w"))
                        or (tgt == "s3" and k == "s3")), None)
            if key and open_[key]:
                out.append((open_[key].pop(0), e["t"]))
    out += [(t, t) for ts in open_.values() for t in ts]
    return out


def fault_allowance(log, t0, t1):
    """How much longer than the kill deadline a stop in [t0, t1] may take because of faults: the
    outages that overlap it, and for each a lease and its margin (the scheduler's lost-attempt
    path); 0 when no fault came near."""
    extra = 0
    for a, b in fault_windows(log):
        if a - 60000 <= t1 and b >= t0 - 60000:
            extra += (b - a) + 1
    return extra


def check_cancel(j, conf, log, res):
    """A cancel of a running attempt is stopped (AttemptStopped, or a terminal record) within the
    kill deadline; when a fault hit the fleet around it, within the deadline plus lease and margin
    (the stop then comes from the scheduler's lease expiry)."""
    if not j.cancel:
        return
    t0 = j.cancel["record"]["occurred_at"]
    stop = None
    for m in j.control:
        if m["offset"] <= j.cancel["offset"]:
            continue
        if m["type"] in ("AttemptStopped", "JobCancelled", "JobCompleted", "JobFailed"):
            stop = m
            break
    if stop is None:
        if j.outcome is None:
            return  # not_terminal says it
        stop = j.terminal
    if stop is None:
        return
    took = stop["record"]["occurred_at"] - t0
    bound = conf.get("kill_deadline_ms", 30000) + conf.get("slack_ms", 5000)
    extra = fault_allowance(log, t0, t0 + took)
    if extra:
        bound += extra + conf.get("lease_ms", 30000) + conf.get("lease_margin_ms", 5000) + \
            conf.get("start_timeout_ms", 0)
    if took > bound:
        res.add("cancel_slow", j.id, f"cancel -> {stop['type']} took {took} ms > {bound} ms", [j.cancel, stop])


def check_staging(jobs, store, conf, run, log, res):
    """After GC, every staging object of the run's tenants belongs to a job that keeps it: a live
    commit of a completed job (its final and the newest keep_checkpoints before it), nothing of a
    cancelled, failed or rejected job."""
    if store is None or not any(e.get("ev") == "gc_done" for e in log):
        return
    keep = conf.get("keep_checkpoints", 2)
    tenants = set(run.get("tenants", []))
    owned = {}
    for j in jobs.values():
        if j.outcome == "completed":
            final = j.commits.get(j.terminal["record"].get("checkpoint_event_id"))
            lives = [c for c in j.live_commits if c is not (final[0] if final else None)]
            # a commit delivered twice (a worker's retry across a broker restart: seeds 6215, 8019)
            # is one checkpoint, as the publisher's retention counts it
            seen, uniq = set(), []
            for c in reversed(lives):
                d = tuple(c["record"].get("object_keys", []))
                if d not in seen:
                    seen.add(d)
                    uniq.append(c)
            lives = uniq[::-1]
            for c in ([final[0]] if final else []) + lives[-keep:]:
                for k in c["record"].get("object_keys", []):
                    owned[k] = j.id
    for key in sorted(store):
        parts = key.split("/")
        if len(parts) < 4 or parts[0] not in ("staging", "sessions") or (tenants and parts[1] not in tenants):
            continue
        if parts[0] == "sessions":  # a session's calls and results: kept only while it lives (and the grace)
            j = jobs.get(parts[2])
            if j is not None and j.outcome is not None:
                res.add("staged_orphan", parts[2], f"{key} left after GC (session {j.outcome})",
                        [j.terminal] if j.terminal else [])
            continue
        jid = parts[2]
        j = jobs.get(jid)
        if j is None or j.outcome is None or key in owned:
            continue  # not terminal: not_terminal says it; owned: kept by retention
        if j.outcome == "completed" and not j.pubs:
            continue  # not published yet: retention keeps everything until then
        res.add("staged_orphan", jid, f"{key} left after GC (job {j.outcome})",
                [j.terminal] if j.terminal else [])


def check_sampling(usage, log, res):
    """The samplers at the end of the run (the driver's sample and sample_probe events): every
    completed job's adapter answers 200 on every sampler, with the same tokens and logprobs on all;
    another tenant gets 404; every answer has a SamplingUsage record of its tenant (by request id),
    and no usage record holds a prompt or an answer."""
    by_req = {}
    for m in usage:
        r = m.get("record") or {}
        by_req[r.get("request_id")] = m
    answers = collections.defaultdict(list)
    for e in log:
        if e.get("ev") == "sample":
            if e.get("status") != 200:
                res.add("sample_unavailable", e.get("job", "?"),
                        f"{e.get('sampler')} answered {e.get('status')}: {e.get('detail', '')}")
                continue
            answers[e["job"]].append(e)
            m = by_req.get(e.get("request_id"))
            if m is None or (m.get("record") or {}).get("tenant_id") != e.get("tenant"):
                res.add("usage_missing", e["job"], f"{e.get('sampler')}'s answer {e.get('request_id')} has no "
                        f"SamplingUsage record of tenant {e.get('tenant')}", [m] if m else [])
        elif e.get("ev") == "sample_probe" and e.get("status") != 404:
            res.add("sample_wrong_tenant", e.get("job", "?"), f"tenant {e.get('tenant')} asked for {e.get('owner')}'s "
                    f"adapter and got {e.get('status')}: {e.get('detail', '')}")
    for jid, got in answers.items():
        first = got[0]
        for e in got[1:]:
            if (e.get("text"), e.get("logprobs")) != (first.get("text"), first.get("logprobs")):
                res.add("sample_mismatch", jid, f"{first.get('sampler')} answered {first.get('text')!r} "
                        f"{first.get('logprobs')}, {e.get('sampler')} {e.get('text')!r} {e.get('logprobs')}")
    secrets = {e.get(k) for e in log if e.get("ev") == "sample" for k in ("prompt", "text") if e.get(k)}
    for m in usage:
        blob = json.dumps(m.get("record"))
        leaked = [x for x in secrets if len(x) >= 4 and json.dumps(x)[1:-1] in blob]
        if leaked:
            res.add("usage_leak", (m.get("record") or {}).get("request_id", "?"),
                    f"a SamplingUsage record holds {leaked[0]!r}", [m])


def check_digests(log, res):
    """Every live API's digest equals the replay's."""
    replay = [e for e in log if e.get("ev") == "replay_digest"]
    if not replay:
        return
    want = replay[-1]["digest"]
    diffs = {e.get("api"): e for e in log if e.get("ev") == "digest_diff"}
    for e in log:
        if e.get("ev") == "api_digest" and e.get("digest") != want:
            d = diffs.get(e.get("api"))
            how = f"; the api has {d.get('api_only')}, the replay {d.get('replay_only')}" if d else ""
            res.add("digest_mismatch", e.get("api", "?"),
                    f"{e.get('api')} digest {e.get('digest')} ({e.get('records_folded')} records folded) "
                    f"!= replay {want}{how}")


# ---------------------------------------------------------------- reading the world

def tail(lathe, topic, env, timeout_ms=4000):
    p = subprocess.run([lathe, "topic", "tail", topic, "--from-beginning", "--timeout-ms", str(timeout_ms)],
                       env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"check: lathe topic tail {topic} exited {p.returncode}: {p.stderr.strip()}")
    out = []
    for line in p.stdout.splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out


def read_topics(lathe, prefix, env=None):
    """Every Lathe topic of prefix from the beginning, read in parallel: base name -> messages."""
    env = dict(env or os.environ, LATHE_TOPIC_PREFIX=prefix)
    recs, errs = {}, []

    def one(t):
        try:
            recs[t] = tail(lathe, t, env)
        except BaseException as e:  # noqa: B902 (reported below)
            errs.append(str(e))
    threads = [threading.Thread(target=one, args=(t,)) for t in TOPICS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errs:
        raise SystemExit(errs[0])
    return recs


def default_store_dir_of(stack):
    """The S3Proxy filesystem backend's bucket directory of the local stack at stack."""
    return os.path.join(stack, "s3", "data", os.environ.get("LATHE_S3_BUCKET", "lathe"))


def default_store_dir():
    stack = os.environ.get("LATHE_STACK_DIR")
    if not stack and os.environ.get("LATHE_KAFKA_CONFIG_DIR"):
        stack = os.path.dirname(os.environ["LATHE_KAFKA_CONFIG_DIR"].rstrip("/"))
    return default_store_dir_of(stack or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                      ".stack"))


def list_store(root, tenants):
    """Object key -> {size, mtime, path} of the run's tenants' objects in a filesystem store."""
    out = {}
    for top in ("staging", "tenants", "sessions"):
        for t in tenants:
            base = os.path.join(root, top, t)
            for d, _, files in os.walk(base):
                for f in files:
                    p = os.path.join(d, f)
                    try:
                        st = os.stat(p)
                    except FileNotFoundError:
                        continue
                    out[os.path.relpath(p, root)] = {"size": st.st_size, "mtime": st.st_mtime, "path": p}
    return out


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def table(runs, faults, res):
    """The campaign table: runs, faults by kind, jobs by outcome, violations by kind."""
    lines = [f"runs: {runs}", f"jobs: {res.jobs} (" + ", ".join(f"{k} {v}" for k, v in sorted(res.outcomes.items()))
             + ")", "workload: " + ", ".join(f"{k} {v}" for k, v in sorted(res.events.items())),
             "faults by kind:"]
    for k, v in sorted(faults.items()):
        lines.append(f"  {k:<22} {v}")
    lines.append(f"  {'total':<22} {sum(faults.values())}")
    by = collections.Counter(v["kind"] for v in res.violations)
    lines.append("violations by kind:")
    for k in KINDS:
        lines.append(f"  {k:<24} {by.get(k, 0)}")
    lines.append(f"  {'total':<24} {len(res.violations)}")
    for v in res.violations:
        lines.append(f"VIOLATION {v['kind']}: job {v['job']}: {v['detail']} [{', '.join(v['records'])}]")
    return "\n".join(lines)


def faults_of(log):
    c = collections.Counter()
    for e in log:
        if e.get("ev") == "fault":
            c[e["kind"]] += 1
    return c


def check_run(lathe, prefix, log, store_dir=None, env=None):
    """Reads the world of one run and checks it: a Result."""
    run = next((e for e in log if e.get("ev") == "run"), {})
    recs = read_topics(lathe, prefix, env)
    root = store_dir or run.get("store_dir") or default_store_dir()
    store = list_store(root, run.get("tenants", [])) if os.path.isdir(root) else None
    return check_records(recs, log, store)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--log", required=True, help="the driver's JSONL of the run")
    ap.add_argument("--lathe", default=os.environ.get("LATHE_CLI", "build/lathe"))
    ap.add_argument("--store-dir")
    ap.add_argument("--records", help="read the records from this JSONL (a run's records.jsonl) instead of "
                    "the topics")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    log = read_log(a.log)
    if a.records:
        recs = collections.defaultdict(list)
        for m in read_log(a.records):
            recs[m["topic"][len(a.prefix):] if m["topic"].startswith(a.prefix) else m["topic"]].append(m)
        run = next((e for e in log if e.get("ev") == "run"), {})
        root = a.store_dir or run.get("store_dir") or default_store_dir()
        store = list_store(root, run.get("tenants", [])) if os.path.isdir(root) else None
        res = check_records(recs, log, store)
    else:
        res = check_run(a.lathe, a.prefix, log, a.store_dir)
    if a.json:
        print(json.dumps({"jobs": res.jobs, "violations": res.violations, "faults": faults_of(log)}))
    else:
        print(table(1, faults_of(log), res))
    return 1 if res.violations else 0


if __name__ == "__main__":
    sys.exit(main())
