#!/usr/bin/python3
"""Training sessions end to end (docs/DESIGN.md §5), driven by the Python client
(clients/python) against the real stack: Kafka broker, object store, and `lathed --role all`
(api, scheduler, publisher, a worker with confined executors) over the tiny base model.

  1. the four primitives and the ones around them: tokenize, forward_backward, optim_step,
     forward (the loss went down), sample, save_state, load_state (the step goes back);
  2. bad input answers 400 naming the field (a token id outside the vocabulary, an empty batch,
     weights of the wrong length, an unknown loss, NaN advantages), and the session stays usable;
     an optim_step with no gradient fails as "invalid" and the session stays usable;
  3. another tenant's id answers 404 on every session route; mode "interactive" on /v1/jobs is
     refused pointing at /v1/sessions;
  4. equivalence: a managed job, and a session fed the managed loop's own batches in order with
     its AdamW parameters (`lathe train --dump-plan`), publish byte-identical
     adapter_model.safetensors;
  5. ending the session publishes its adapter; a call after the end answers 409.

usage: sessions_python.py PATH/TO/lathe PATH/TO/lathed
Environment: the stack's (`ops/stack env`), LATHE_E2E_CACHE (where the tiny base model is made
once). Exits non-zero with a message on any failure."""
import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import lt_test
from lt_test import BOOTSTRAP, ROOT, Child, admin_client, run

sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
import lathe_client  # noqa: E402
from lathe_client import AdamParams, InvalidCall, SamplingParams, ServiceClient, sft_datum  # noqa: E402

CHECKS = []
LATHE = []  # the lathe binary (main)


def fail(msg):
    raise SystemExit(f"sessions: FAIL: {msg}")


def check(cond, what):
    if not cond:
        fail(what)
    CHECKS.append(what)
    print(f"sessions: ok: {what}", flush=True)


def http(base, key, method, path, body=None, raw=None, headers=None, answer_headers=None):
    """(status, JSON or bytes); the answer's headers into answer_headers (a dict) when given."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers=dict({"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                                              **(headers or {})))
    try:
        with urllib.request.urlopen(req, timeout=90) as r:
            payload = r.read()
            if answer_headers is not None:
                answer_headers.update(r.headers.items())
            return r.status, (json.loads(payload) if payload[:1] in (b"{", b"[") else payload)
    except urllib.error.HTTPError as e:
        payload = e.read()
        if answer_headers is not None:
            answer_headers.update(e.headers.items())
        try:
            return e.code, json.loads(payload)
        except ValueError:
            return e.code, payload


def sse_events(base, key, path, want, timeout=30):
    """The event types of a Server-Sent Events stream, read until every type in want was seen."""
    import http.client
    u = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
    r = conn.getresponse()
    seen, deadline = [], time.time() + timeout
    while not set(want) <= set(seen) and time.time() < deadline:
        line = r.fp.readline().decode()
        if not line:
            break
        if line.startswith("event:"):
            seen.append(line.split(":", 1)[1].strip())
    conn.close()
    return seen


def model_dir(lathe, env):
    cache = os.environ.get("LATHE_E2E_CACHE") or "/tmp/lathe-e2e-models"
    d = os.path.join(cache, "lathe-tiny")
    if not os.path.exists(os.path.join(d, "model.safetensors")):
        run([lathe, "model", "make", "--steps", "20", "--threads", "2", "--force", "--out", d], env, "lathe model make")
    return cache


def dataset(path, n=24):
    months = ["January", "February", "March", "April", "May", "June", "July", "August"]
    with open(path, "w") as f:
        for i in range(n):
            m = months[i % len(months)]
            f.write(json.dumps({"prompt": f"date: {m} {i % 27 + 1}, {1990 + i}\niso:",
                                "completion": f" {1990 + i}-{i % len(months) + 1:02d}-{i % 27 + 1:02d}"}) + "\n")


# ---- 1-3: the primitives, bad input, isolation ----

def primitives(svc, base, key_a, key_b):
    tok = svc.tokenize("lathe-tiny", "date: March 5, 2021\niso:")
    check(len(tok) > 3 and svc.detokenize("lathe-tiny", tok) == "date: March 5, 2021\niso:",
          "tokenize and detokenize go through the server's tokenizer and back")
    half = svc.detokenize("lathe-tiny", [131])          # one byte of a character cut in two
    check(half == "\ufffd", f"ids that are not whole UTF-8 decode to U+FFFD, as Hugging Face's do ({half!r})")
    batch = [sft_datum(svc.tokenize("lathe-tiny", "date: March 5, 2021\niso:"), svc.tokenize("lathe-tiny", " 2021-03-05")),
             sft_datum(svc.tokenize("lathe-tiny", "date: 7 June 1999\niso:"), svc.tokenize("lathe-tiny", " 1999-06-07"))]
    tc = svc.create_lora_training_client("lathe-tiny", rank=4, alpha=8, seed=5)
    check(tc.id.startswith("ses-"), f"POST /v1/sessions made session {tc.id}")
    before = tc.forward(batch)                       # queued while the session waits for a slot
    fb = tc.forward_backward(batch)
    opt = tc.optim_step(AdamParams(lr=2e-2))
    after = tc.forward(batch)
    b, f, o, a = before.result(timeout=300), fb.result(timeout=300), opt.result(timeout=300), after.result(timeout=300)
    check(abs(b.loss - f.loss) < 1e-5 and f.loss > 0, f"forward and forward_backward agree on the loss ({b.loss:.4f})")
    check([len(x) for x in f.logprobs] == [len(d.tokens) for d in batch], "logprobs come per example, one per token")
    check(o.step == 1 and o.grad_norm > 0, f"optim_step took step 1 (grad norm {o.grad_norm:.3f})")
    check(a.loss < b.loss, f"the loss went down after the step ({b.loss:.4f} -> {a.loss:.4f})")
    s = tc.sample(tok, 3, SamplingParams(max_tokens=6, temperature=1.0, seed=1)).result(timeout=120)
    check(len(s.samples) == 3 and all(0 < len(x.tokens) <= 6 and all(lp <= 0 for lp in x.logprobs) for x in s.samples),
          "sample gives 3 samples of at most 6 tokens with log-probs")
    saved = tc.save_state("s1").result(timeout=120)
    check(saved.step == 1, "save_state s1 at step 1 (committed like a checkpoint)")
    u = svc.usage()["usage"]
    check(u["sessions"] >= 1 and u["queued_or_running_jobs"] >= u["sessions"] and u["running_slots"] >= 1,
          f"GET /v1/usage counts the live session and its slot ({u})")
    tc.forward_backward(batch)
    check(tc.optim_step(AdamParams(lr=2e-2)).result(timeout=120).step == 2, "a second step")
    check(tc.load_state("s1").result(timeout=120).step == 1, "load_state s1 brings the state back to step 1")
    check(tc.state()["step"] == 1 and any(x["name"] == "s1" for x in tc.state()["saved"]),
          "GET the session says step 1 and lists s1")
    ev = sse_events(base, key_a, f"/v1/sessions/{tc.id}/events", ["AttemptStarted", "PrimitiveCompleted"])
    check("PrimitiveCompleted" in ev and "AttemptStarted" in ev,
          f"the session's event stream carries its calls' PrimitiveCompleted ({ev.count('PrimitiveCompleted')} of them)")

    path = f"/v1/sessions/{tc.id}/calls"
    ex = {"tokens": [1, 2, 3], "targets": [2, 3, 4], "weights": [1, 1, 1]}
    bad = [({"kind": "forward_backward", "data": [dict(ex, tokens=[1, 999999, 3])]}, "data[0].tokens[1]"),
           ({"kind": "forward_backward", "data": []}, "data"),
           ({"kind": "forward_backward", "data": [dict(ex, weights=[1, 1])]}, "data[0].weights"),
           ({"kind": "forward_backward", "loss": "hinge", "data": [ex]}, "loss"),
           ({"kind": "teleport"}, "kind")]
    for body, field in bad:
        st, r = http(base, key_a, "POST", path, body)
        check(st == 400 and r["error"]["field"] == field, f"400 naming {field}: {r.get('error', {}).get('message')}")
    raw = (b'{"kind":"forward_backward","loss":"importance_sampling","data":[{"tokens":[1,2],"targets":[2,3],'
           b'"logprobs":[-1,-1],"advantages":[0.5,NaN]}]}')
    st, r = http(base, key_a, "POST", path, raw=raw)
    check(st == 400 and r["error"]["field"] == "data[0].advantages[1]", f"NaN advantages: 400 naming the field")
    try:
        tc.optim_step(AdamParams(lr=1e-3)).result(timeout=120)
        fail("an optim_step with no gradient succeeded")
    except InvalidCall as e:
        check(True, f"optim_step without a gradient fails as invalid: {e}")
    check(tc.forward(batch).result(timeout=120).loss > 0, "the session is still usable after the bad calls")

    # Another tenant: every route of this session is 404.
    for method, p, body in [("GET", f"/v1/sessions/{tc.id}", None), ("POST", path, {"kind": "save_state", "name": "x"}),
                            ("GET", f"{path}/{saved.seq if hasattr(saved, 'seq') else 0}?wait=0", None),
                            ("POST", f"/v1/sessions/{tc.id}/cancel", None), ("DELETE", f"/v1/sessions/{tc.id}", None),
                            ("GET", f"/v1/sessions/{tc.id}/artifacts", None)]:
        st, _ = http(base, key_b, method, p, body)
        check(st == 404, f"tenant B: {method} {p.split('?')[0]} -> 404")
    st, r = http(base, key_b, "GET", "/v1/sessions")
    check(st == 200 and all(x["id"] != tc.id for x in r["data"]), "tenant B's session list does not show A's")
    st, r = http(base, key_a, "POST", "/v1/jobs", {"base_model": "lathe-tiny", "dataset_id": "ds-x", "mode": "interactive"})
    check(st == 400 and r["error"]["field"] == "mode" and "/v1/sessions" in r["error"]["message"],
          "mode interactive on /v1/jobs is refused, pointing at /v1/sessions")
    cli = subprocess.run([LATHE[0], "sessions", "show", tc.id, "--url", base, "--api-key", key_a], capture_output=True,
                         text=True, timeout=60)
    check(cli.returncode == 0 and tc.id in cli.stdout and "s1@1" in cli.stdout, f"lathe sessions show: {cli.stdout.strip()}")
    cli = subprocess.run([LATHE[0], "sessions", "show", tc.id, "--url", base, "--api-key", key_b], capture_output=True,
                         text=True, timeout=60)
    check(cli.returncode != 0 and "no session" in cli.stderr, "lathe sessions show with another tenant's key: not found")
    tc.end()
    check(tc.wait_until(timeout=300)["state"] == "completed", "DELETE ends the session: completed, its slot freed")
    return tc


# ---- 3a: a call sent again with its Idempotency-Key runs once ----

def post_keyed(base, key, path, body, idem):
    """POST a call with an Idempotency-Key: (status, answer, whether the answer says it replayed)."""
    h = {}
    st, r = http(base, key, "POST", path, body, headers={"Idempotency-Key": idem}, answer_headers=h)
    return st, r, h.get("Idempotent-Replayed") == "true"


def calls_of(env, job_id, topic, kind):
    """The records of a session in one of its topics (`lathe topic tail`), oldest first."""
    p = subprocess.run([LATHE[0], "topic", "tail", topic, "--from-beginning", "--timeout-ms", "3000"], env=env,
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"lathe topic tail {topic}: {p.stderr}")
    out = []
    for line in p.stdout.splitlines():
        rec = json.loads(line)
        if rec.get("type") == kind and rec.get("record", {}).get("job_id") == job_id:
            out.append(rec)
    return out


def idempotency(svc, base, key_a, env, daemon):
    """The same call POSTed twice with one Idempotency-Key is one call: the retry answers its seq
    (Idempotent-Replayed: true), another body under the key is 422, and a second SessionCall of the
    key's call id written into the log (as two API processes racing would) is not run again: GET of
    its seq answers the first's result. Returns what the restart check (idle) needs."""
    batch = [sft_datum(svc.tokenize("lathe-tiny", "date: May 1, 2001\niso:"), svc.tokenize("lathe-tiny", " 2001-05-01"))]
    spec, k = {"base_model": "lathe-tiny", "lora": {"rank": 4, "alpha": 8}, "seed": 11}, f"open-{secrets.token_hex(6)}"
    st1, s1 = http(base, key_a, "POST", "/v1/sessions", spec, headers={"Idempotency-Key": k})
    st2, s2 = http(base, key_a, "POST", "/v1/sessions", spec, headers={"Idempotency-Key": k})
    check(st1 == 201 and st2 == 200 and s1["id"] == s2["id"],
          f"POST /v1/sessions sent again with its Idempotency-Key: the same session {s1.get('id')} ({st1}, {st2})")
    st, _ = http(base, key_a, "POST", f"/v1/sessions/{s1['id']}/cancel")
    check(st in (200, 202), f"and it is cancelled ({st})")
    tc = svc.create_lora_training_client("lathe-tiny", rank=4, alpha=8, seed=9)
    path = f"/v1/sessions/{tc.id}/calls"
    tc.forward_backward(batch)
    body = {"kind": "optim_step", "adam": {"lr": 1e-2}}
    idem = f"step-{secrets.token_hex(6)}"
    st, r, replayed = post_keyed(base, key_a, path, body, idem)
    check(st == 202 and not replayed, f"a keyed optim_step is queued as call {r.get('seq')}")
    seq = r["seq"]
    st, r2, replayed = post_keyed(base, key_a, path, body, idem)
    check(st == 202 and r2["seq"] == seq and replayed,
          f"sent again with its Idempotency-Key: 202, the same seq {r2.get('seq')}, Idempotent-Replayed: true")
    st, r3, _ = post_keyed(base, key_a, path, dict(body, adam={"lr": 5e-2}), idem)
    check(st == 422 and r3["error"]["field"] == "Idempotency-Key" and str(seq) in r3["error"]["message"],
          f"the key with another body: 422 naming the Idempotency-Key and call {seq}")
    st, r4 = http(base, key_a, "POST", path, body, headers={"Idempotency-Key": "no spaces allowed"})
    check(st == 400 and r4["error"]["field"] == "Idempotency-Key", "a malformed Idempotency-Key: 400 naming it")
    first = calls_of(env, tc.id, "calls", "SessionCall")
    keyed = [c for c in first if c["offset"] + 1 == seq]
    check(len(keyed) == 1 and keyed[0]["record"]["call_id"].startswith("k") and
          len(first) == 2, f"the log holds one SessionCall of the keyed call (and the forward_backward): {len(first)}")
    forged = dict(keyed[0]["record"], event_id=secrets.token_hex(16), producer="api/other")
    p = subprocess.run([LATHE[0], "topic", "produce", "calls", "SessionCall"], env=env, input=json.dumps(forged) + "\n",
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"lathe topic produce: {p.stderr}")
    dup = json.loads(p.stdout.splitlines()[-1])["offset"] + 1
    done = tc.forward(batch).result(timeout=300)  # runs after the copy: the worker has read it by then
    st, a = http(base, key_a, "GET", f"{path}/{seq}?wait=60")
    st2, b = http(base, key_a, "GET", f"{path}/{dup}?wait=60")
    check(st == 200 and a["status"] == "done" and a["step"] == 1 and st2 == 200 and b == a,
          f"GET of the copy's seq {dup} answers call {seq}'s result (step {a.get('step')})")
    ran = [c["record"]["seq"] for c in calls_of(env, tc.id, "progress", "PrimitiveCompleted")]
    check(ran.count(seq) == 1 and dup not in ran and done.loss > 0,
          f"the worker ran the keyed call once and the copy never (PrimitiveCompleted of calls {ran})")
    daemon.wait_for(r"repeats call id k[0-9a-f]{32}", 30)
    check(tc.state()["step"] == 1, "the session took one optimizer step for the three POSTs and the copy")
    tc.end()
    check(tc.wait_until(timeout=300)["state"] == "completed", "the keyed session ended")
    st, r, replayed = post_keyed(base, key_a, path, body, idem)
    check(st == 202 and r["seq"] == seq and replayed, "after the end the key still answers its call's seq")
    # The worker deleted the call's body once it was answered: a retry is compared with its digest.
    st, r5, _ = post_keyed(base, key_a, path, {"adam": {"lr": 1e-2}, "kind": "optim_step"}, idem)
    check(st == 202 and r5["seq"] == seq, "its body gone, the same body with its keys in another order is the call")
    st, r6, _ = post_keyed(base, key_a, path, dict(body, adam={"lr": 5e-2}), idem)
    check(st == 422 and r6["error"]["field"] == "Idempotency-Key",
          "its body gone, the key with another body is still 422")
    return {"path": path, "body": body, "idem": idem, "seq": seq}


# ---- 4: the same batches as a managed job give the same adapter ----

HP = {"max_steps": 4, "batch_size": 2, "grad_accum": 2, "lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.1,
      "seed": 3, "learning_rate": 1e-3, "warmup_steps": 1, "eval_interval": 1000, "checkpoint_interval": 1000}


def artifact_sha(base, key, kind, job_id):
    st, data = http(base, key, "GET", f"/v1/{kind}/{job_id}/artifacts/adapter_model.safetensors")
    if st != 200 or not isinstance(data, bytes):
        fail(f"{kind} {job_id}: adapter_model.safetensors answered {st}: {str(data)[:200]}")
    return hashlib.sha256(data).hexdigest()


def equivalence(svc, base, key, lathe, env, models, tmp):
    path = os.path.join(tmp, "train.jsonl")
    dataset(path)
    ds = svc.upload_dataset(path, "dates")
    job = svc.submit_job({"base_model": "lathe-tiny", "dataset_id": ds["id"], "hyperparameters": HP})
    plan = os.path.join(tmp, "plan.jsonl")
    sets = []
    for k, v in HP.items():
        sets += ["--set", f"{k}={v}"]
    run([lathe, "train", "--model", os.path.join(models, "lathe-tiny"), "--train", path, "--out",
         os.path.join(tmp, "local"), "--dump-plan", plan] + sets, env, "lathe train --dump-plan")
    events = [json.loads(line) for line in open(plan)]
    check(sum(e["type"] == "optim" for e in events) == HP["max_steps"] and
          sum(e["type"] == "batch" for e in events) == HP["max_steps"] * HP["grad_accum"],
          f"the plan has {HP['max_steps']} updates of {HP['grad_accum']} micro-batches")
    tc = svc.create_lora_training_client("lathe-tiny", rank=HP["lora_rank"], alpha=HP["lora_alpha"],
                                         dropout=HP["lora_dropout"], seed=HP["seed"])
    futures = []
    for e in events:                                  # pipelined: every call sent before any result
        if e["type"] == "batch":
            futures.append(tc.forward_backward(e["rows"]))
        else:
            futures.append(tc.optim_step(e["adam"]))
    last = futures[-1].result(timeout=600)
    check(last.step == HP["max_steps"], f"the session replayed the plan to step {last.step}")
    tc.end()
    s = tc.wait_until(timeout=300)
    check(s["state"] == "completed", "the session completed after DELETE")
    j = svc.wait_job(job["id"], timeout=600, artifacts=True)
    check(j["state"] == "completed", "the managed job completed")
    for _ in range(60):                              # the publisher promotes the session's adapter
        st, r = http(base, key, "GET", f"/v1/sessions/{tc.id}/artifacts")
        if st == 200 and any(a.get("name") == "adapter_model.safetensors" for a in r.get("artifacts", r.get("data", []))):
            break
        time.sleep(1)
    a_job, a_ses = artifact_sha(base, key, "jobs", job["id"]), artifact_sha(base, key, "sessions", tc.id)
    check(a_job == a_ses, f"managed job and session adapters are byte-identical (sha256 {a_job[:16]}...)")
    st, r = http(base, key, "POST", f"/v1/sessions/{tc.id}/calls", {"kind": "save_state", "name": "late"})
    check(st == 409, "a call after the end answers 409")


# ---- 6: the worker holding a session is killed mid-call ----

def big_batch(svc, n=48):
    p = svc.tokenize("lathe-tiny", "date: September 30, 2017 in the long form of the calendar\niso:")
    c = svc.tokenize("lathe-tiny", " 2017-09-30")
    return [sft_datum(p + p[: i % 7], c) for i in range(n)]


def loop(tc, batches, lr):
    """One optimizer step per batch, pipelined; the futures."""
    out = []
    for b in batches:
        out.append(tc.forward_backward(b))
        out.append(tc.optim_step(AdamParams(lr=lr)))
    return out


def failure(lathed, env, tmp, key):
    """api, scheduler and publisher in one process, two workers of their own; the worker holding
    a session is paused as a large forward_backward starts, then killed with SIGKILL."""
    fast = dict(env, LATHE_LEASE_MS="4000", LATHE_LEASE_MARGIN_MS="1000", LATHE_API_KEY_RATE="off",
                LATHE_API_TENANT_RATE="off")
    kids = []
    try:
        for role in ("api", "scheduler", "publisher"):
            kids.append(Child(role, [lathed, "--role", role, "--port", "0", "--operator-port", "0"],
                              dict(fast, LATHE_INSTANCE=f"f{role}")))
        workers = {}
        for w in ("w1", "w2"):
            workers[w] = Child(w, [lathed, "--role", "worker"], dict(fast, LATHE_INSTANCE=w))
            kids.append(workers[w])
        port = int(kids[0].wait_for(r"listening on http://127\.0\.0\.1:(\d+)", 90).group(1))
        kids[1].wait_for(r"scheduler: leading \(", 90)
        svc = ServiceClient(base_url=f"http://127.0.0.1:{port}", api_key=key, timeout=120)
        for _ in range(120):                                  # until the new API has folded the tenants
            try:
                svc.list_sessions()
                break
            except (lathe_client.AuthError, lathe_client.Unavailable):
                time.sleep(0.5)
        small = [[sft_datum(svc.tokenize("lathe-tiny", f"date: May {d}, 2003\niso:"),
                            svc.tokenize("lathe-tiny", f" 2003-05-{d:02d}"))] for d in range(1, 7)]
        big = big_batch(svc)
        # The uninterrupted run: 3 steps, save, 3 steps, end.
        ref = svc.create_lora_training_client("lathe-tiny", rank=4, alpha=8, dropout=0.1, seed=11)
        loop(ref, small[:3], 1e-2)
        ref.save_state("three").result(timeout=300)
        loop(ref, small[3:], 1e-2)[-1].result(timeout=300)
        ref.end()
        check(ref.wait_until(timeout=300)["state"] == "completed", "the uninterrupted session completed")
        # The same, with its worker killed after the save, during a large call.
        tc = svc.create_lora_training_client("lathe-tiny", rank=4, alpha=8, dropout=0.1, seed=11)
        loop(tc, small[:3], 1e-2)
        saved = tc.save_state("three").result(timeout=300)
        a0 = tc.state()["attempt"]  # 1, unless a worker of an earlier phase (gone) was dispatched it first
        victim = next(w for w, c in workers.items() if f"started {tc.id} attempt {a0} " in c.text())
        doomed = [tc.forward_backward(big)]                   # recorded: the worker takes it up
        # Paused at once, the worker answers nothing more (a quiet machine ran all of these within the
        # half second the test used to wait); the calls after it stay outstanding; then it dies.
        workers[victim].p.send_signal(signal.SIGSTOP)
        doomed += loop(tc, small[3:], 1e-2)
        workers[victim].p.kill()
        restarted = 0
        for f in doomed:
            try:
                f.result(timeout=300)
            except lathe_client.SessionRestarted as e:
                restarted += 1
                check(e.resumed_from_step == saved.step, f"call {f.seq} failed with session_restarted, resumed from "
                                                          f"step {e.resumed_from_step}")
        check(restarted >= len(doomed) - 1, f"{restarted} of {len(doomed)} calls in flight failed with the typed error "
                                            f"(all but perhaps the first)")
        check(tc.state()["step"] == saved.step and tc.state()["attempt"] > a0,
              f"the session says it is at step {saved.step}, on attempt {tc.state()['attempt']} (was {a0})")
        last = loop(tc, small[3:], 1e-2)[-1].result(timeout=300)
        check(last.step == 6, "the calls after the restart ran on the other worker, to step 6")
        tc.end()
        check(tc.wait_until(timeout=300)["state"] == "completed", "the restarted session completed")
        base = f"http://127.0.0.1:{port}"
        for sid in (ref.id, tc.id):
            for _ in range(60):
                st, r = http(base, key, "GET", f"/v1/sessions/{sid}/artifacts")
                if st == 200 and r.get("artifacts"):
                    break
                time.sleep(1)
        check(artifact_sha(base, key, "sessions", ref.id) == artifact_sha(base, key, "sessions", tc.id),
              "the restarted session ends with the uninterrupted one's adapter, byte for byte")
        # An end acknowledged while its worker is being declared lost still ends the session: the
        # new attempt runs it from the saved state (it used to fail it with session_restarted, and
        # the session, which no client waits on after a 202, ran on for good).
        workers["w3"] = Child("w3", [lathed, "--role", "worker"], dict(fast, LATHE_INSTANCE="w3"))
        kids.append(workers["w3"])
        te = svc.create_lora_training_client("lathe-tiny", rank=4, alpha=8, dropout=0.1, seed=11)
        loop(te, small[:2], 1e-2)
        two = te.save_state("two").result(timeout=300)
        a1 = te.state()["attempt"]
        holder = next(w for w, c in workers.items() if f"started {te.id} attempt {a1} " in c.text())
        workers[holder].p.kill()
        te.end()                                              # recorded before the next attempt starts
        final = te.wait_until(timeout=300)
        check(final["state"] == "completed" and final["attempt"] > a1,
              f"the end sent as its worker died ended the session on a later attempt ({final['state']}, attempt "
              f"{final['attempt']}, was {a1})")
        check(final["step"] == two.step, f"it ended from the saved state, at step {final['step']} (saved {two.step})")
        # The worker holding a session stopped with SIGTERM drains: the session checkpoints where it
        # is and goes on on another worker from that step; no call fails.
        workers["w4"] = Child("w4", [lathed, "--role", "worker"], dict(fast, LATHE_INSTANCE="w4"))
        kids.append(workers["w4"])
        workers["w4"].wait_for(r"worker .* started", 60)
        td = svc.create_lora_training_client("lathe-tiny", rank=4, alpha=8, dropout=0.1, seed=11)
        three = loop(td, small[:3], 1e-2)[-1].result(timeout=300)
        a2 = td.state()["attempt"]
        holder = next(w for w, c in workers.items() if f"started {td.id} attempt {a2} " in c.text())
        workers[holder].p.send_signal(signal.SIGTERM)
        try:
            rc = workers[holder].p.wait(90)
        except subprocess.TimeoutExpired:
            rc = None
        workers[holder].t.join(5)
        check(rc == 0 and "worker drained, stopping" in workers[holder].text(),
              f"the session's worker drained on SIGTERM and exited 0 (exit {rc})")
        last = loop(td, small[3:], 1e-2)[-1].result(timeout=300)
        check(last.step == 6 and td.state()["attempt"] > a2,
              f"the drained session went on to step 6 from step {three.step} on attempt {td.state()['attempt']} "
              f"(was {a2}), no call failed")
        td.end()
        check(td.wait_until(timeout=300)["state"] == "completed", "the drained session completed")
        # A session whose executor cannot stop within the kill deadline (here SIGSTOPped) is killed
        # by the drain: recorded failed, so the call that was in flight fails with session_restarted
        # and the session says it is back at its save (recorded preempted, it would be re-run on the
        # saved state as if nothing was lost).
        workers["w5"] = Child("w5", [lathed, "--role", "worker"], dict(fast, LATHE_INSTANCE="w5"))
        kids.append(workers["w5"])
        workers["w5"].wait_for(r"worker .* started", 60)
        tk = svc.create_lora_training_client("lathe-tiny", rank=4, alpha=8, dropout=0.1, seed=11)
        loop(tk, small[:3], 1e-2)
        saved3 = tk.save_state("three").result(timeout=300)
        loop(tk, small[3:4], 1e-2)[-1].result(timeout=300)  # step 4, answered, never saved
        a3 = tk.state()["attempt"]
        holder = next(w for w, c in workers.items() if c.p.poll() is None and
                      f"started {tk.id} attempt {a3} " in c.text())
        m = re.search(rf"started {re.escape(tk.id)} attempt {a3} \(pid (\d+)\)", workers[holder].text())
        check(m is not None, "the worker named its executor's pid")
        os.kill(int(m.group(1)), signal.SIGSTOP)
        inflight = loop(tk, small[4:5], 1e-2)
        workers[holder].p.send_signal(signal.SIGTERM)
        try:
            rc = workers[holder].p.wait(90)  # the kill deadline (30 s), then the drain's end
        except subprocess.TimeoutExpired:
            rc = None
        workers[holder].t.join(5)
        check(rc == 0 and "killed" in workers[holder].text(),
              f"the drain killed the executor at its deadline and the worker exited 0 (exit {rc})")
        try:
            inflight[0].result(timeout=300)
            got = "answered"
        except lathe_client.SessionRestarted as e:
            got = f"session_restarted from step {e.resumed_from_step}"
        check(got == f"session_restarted from step {saved3.step}",
              f"the call in flight when the session was killed: {got} (saved at {saved3.step})")
        check(tk.state()["step"] == saved3.step, f"the session says it is at step {tk.state()['step']}, its save")
        tk.end()
        check(tk.wait_until(timeout=300)["state"] == "completed", "the killed session completed from its save")
    except BaseException:
        for c in kids:
            c.dump()
        raise
    finally:
        for c in kids:
            c.stop()


# ---- 7: an idle session saves its state, frees its slot, and wakes on the next call ----

def idle(lathed, env, key, keyed=None, key_a=None):
    """keyed (from idempotency): its Idempotency-Key sent to this new API process, which read it
    back from lathe.calls."""
    kid = Child("lathed-idle", [lathed, "--role", "all", "--port", "0", "--operator-port", "0"],
                dict(env, LATHE_INSTANCE="sesidle", LATHE_SESSION_IDLE_MS="1500", LATHE_API_KEY_RATE="off",
                     LATHE_API_TENANT_RATE="off"))
    try:
        port = int(kid.wait_for(r"listening on http://127\.0\.0\.1:(\d+)", 90).group(1))
        svc = ServiceClient(base_url=f"http://127.0.0.1:{port}", api_key=key, timeout=120)
        for _ in range(120):
            try:
                svc.list_sessions()
                break
            except (lathe_client.AuthError, lathe_client.Unavailable):
                time.sleep(0.5)
        if keyed:
            st, r, replayed = post_keyed(f"http://127.0.0.1:{port}", key_a, keyed["path"], keyed["body"], keyed["idem"])
            check(st == 202 and r["seq"] == keyed["seq"] and replayed,
                  f"after a restart, another API process answers the Idempotency-Key with call {r.get('seq')} again")
        batch = [sft_datum(svc.tokenize("lathe-tiny", "date: April 2, 2011\niso:"), svc.tokenize("lathe-tiny", " 2011-04-02"))]
        tc = svc.create_lora_training_client("lathe-tiny", rank=4, alpha=8, seed=2)
        tc.forward_backward(batch)
        check(tc.optim_step(AdamParams(lr=1e-2)).result(timeout=300).step == 1, "a step before going idle")
        loss = tc.forward(batch).result(timeout=300).loss
        ran_on = tc.state()["attempt"]  # 1, unless a worker of an earlier phase was dispatched it first
        st = {}
        for _ in range(60):
            st = tc.state()
            if st.get("idle") and st["state"] == "queued":
                break
            time.sleep(0.5)
        check(st.get("idle") and st["state"] == "queued", f"idle for 1.5 s, the session is parked: {st.get('state')}")
        # A long poll of a call the session never had wakes nothing (it re-dispatched the session
        # before: a slot and a checkpoint for each such poll)
        code, _ = http(f"http://127.0.0.1:{port}", key, "GET", f"/v1/sessions/{tc.id}/calls/999999999?wait=2")
        time.sleep(1)
        st2 = tc.state()
        check(code == 200 and st2.get("idle") and st2["state"] == "queued" and st2["attempt"] == st["attempt"],
              f"a poll of a call it never had leaves the parked session parked ({code} {st2.get('state')}, "
              f"attempt {st2.get('attempt')})")
        again = tc.forward(batch).result(timeout=300)
        st = tc.state()
        check(st["state"] == "running" and st["attempt"] == ran_on + 1 and not st["idle"],
              f"the next call woke it: running again, on the next attempt ({st['attempt']})")
        check(abs(again.loss - loss) < 1e-6 and st["step"] == 1, "with its state as it left it (step 1, the same loss)")
        # Long calls (64 samples of up to 200 tokens each), so that the cancel lands among them: 24 of
        # them, as a quiet machine runs a few before the cancel reaches the worker (~1 s each here).
        late = [tc.sample_many([batch[0].tokens[:4]] * 16, 4, SamplingParams(max_tokens=200, seed=3)) for _ in range(24)]
        tc.cancel()
        check(tc.wait_until(timeout=120)["state"] == "cancelled", "cancel stops a running session: cancelled")
        ended = 0
        for f in late:
            try:
                f.result(timeout=60)
            except lathe_client.CallFailed as e:
                ended += e.code == "session_ended"
        check(ended >= 1, f"calls it did not run answer session_ended ({ended} of {len(late)})")
        gone = tc.delete()
        code, _ = http(f"http://127.0.0.1:{port}", key, "GET", f"/v1/sessions/{tc.id}")
        check(gone.get("deleted") is True and code == 410,
              f"the client deletes the finished session ({gone.get('objects_deleted')} objects), then 410 ({code})")
    except BaseException:
        kid.dump()
        raise
    finally:
        kid.stop()


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: sessions_python.py PATH/TO/lathe PATH/TO/lathed")
    lathe, lathed = sys.argv[1], sys.argv[2]
    LATHE.append(lathe)
    admin = admin_client(fail)
    run_id = f"{os.getpid()}{secrets.token_hex(3)}"
    prefix = f"tses{run_id}."
    env = dict(os.environ, LATHE_KAFKA_BOOTSTRAP=BOOTSTRAP, LATHE_TOPIC_PREFIX=prefix, LATHE_SOURCE_ROOT=ROOT)
    tmp = tempfile.mkdtemp(prefix="lathe-sessions-")
    models = model_dir(lathe, env)
    env["LATHE_MODELS_DIR"] = models
    children = []
    try:
        run([lathe, "admin", "topics"], env, "lathe admin topics")
        keys = []
        for t in ("a", "b"):
            out = run([lathe, "admin", "tenant", "create", f"ses{t}{run_id}", "--json"], env, "lathe admin tenant create")
            keys.append(json.loads(out)["api_key"])
        d = Child("lathed", [lathed, "--role", "all", "--port", "0", "--operator-port", "0"],
                  dict(env, LATHE_INSTANCE=f"ses{run_id}", LATHE_API_KEY_RATE="off", LATHE_API_TENANT_RATE="off",
                       LATHE_WORKER_SLOTS="2"))
        children.append(d)
        port = int(d.wait_for(r"listening on http://127\.0\.0\.1:(\d+)", 90).group(1))
        d.wait_for(r"scheduler: leading \(", 90)
        base = f"http://127.0.0.1:{port}"
        svc = ServiceClient(base_url=base, api_key=keys[0], timeout=120)
        try:
            primitives(svc, base, keys[0], keys[1])
            keyed = idempotency(svc, base, keys[0], env, d)
            equivalence(svc, base, keys[0], lathe, env, models, tmp)
        except BaseException:
            d.dump()
            raise
        d.stop()
        idle(lathed, env, keys[1], keyed, keys[0])
        failure(lathed, env, tmp, keys[0])
    finally:
        for c in children:
            c.stop()
        lt_test.delete_topics(admin, prefix)
        subprocess.run(["rm", "-rf", tmp])
    print(f"sessions: {len(CHECKS)} checks passed ({lathe_client.__version__})")


if __name__ == "__main__":
    main()
