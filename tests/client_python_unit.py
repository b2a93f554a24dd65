#!/usr/bin/python3
"""client_python_unit: the Python client (clients/python/lathe_client) against an in-process fake.

The fake (http.server on a loopback port) is not Lathe: it only records what the client sends
and answers what the test tells it, to check the client's side of the sessions contract --
request bodies, the order of the POSTs while results are awaited later, long polling, and the
mapping of errors to typed exceptions (400 -> InvalidRequest with its field, a failed call with
session_restarted -> SessionRestarted with resumed_from_step), and which POSTs are sent again: a
call's, with its own Idempotency-Key each time (the fake answers a repeated key with the first
seq, as Lathe does), never a POST without a key.

usage: client_python_unit.py      (LATHE_SOURCE_ROOT: the repository; else this file's parent)"""
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

ROOT = os.environ.get("LATHE_SOURCE_ROOT", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

import lathe_client as lc  # noqa: E402

KEY = "lt_test_key"


class Fake:
    """What the fake server knows: the requests it got, in arrival order, and the calls' fates."""

    def __init__(self):
        self.lock = threading.Condition()
        self.requests = []            # (method, path, query, headers, body bytes)
        self.calls = []               # POSTed call bodies, index = seq - 1
        self.keys = {}                # Idempotency-Key -> seq of the call it queued
        self.outcomes = {}            # seq -> the GET answer once the call is finished
        self.script = {}              # (method, path) -> list of (status, body, headers) to answer first;
        #                               status 0: take the request, then close without an answer
        self.job_states = ["queued", "running", "completed"]

    def finish(self, seq, **answer):
        with self.lock:
            self.outcomes[seq] = dict({"seq": seq, "kind": self.calls[seq - 1]["kind"]}, **answer)
            self.lock.notify_all()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, status, body=None, headers=None, raw=None):
        data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def handle_any(self):
        fake: Fake = self.server.fake
        u = urlsplit(self.path)
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        with fake.lock:
            fake.requests.append((self.command, u.path, parse_qs(u.query), dict(self.headers), body))
            scripted = fake.script.get((self.command, u.path))
            drop = bool(scripted) and scripted[0][0] == 0
            if scripted and not drop:
                status, b, h = scripted.pop(0)
                return self.reply(status, b, h)
            if drop:
                scripted.pop(0)
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            return self.reply(401, {"error": {"code": "unauthorized", "message": "bad key", "field": None}})
        parts = u.path.strip("/").split("/")
        if self.command == "POST" and u.path == "/v1/sessions":
            return self.reply(201, {"id": "ses-1", "state": "queued"})
        if parts[:2] == ["v1", "sessions"] and len(parts) >= 3 and parts[2] != "ses-1":
            return self.reply(404, {"error": {"code": "not_found", "message": "no such session", "field": None}})
        if self.command == "POST" and u.path == "/v1/sessions/ses-1/calls":
            call = json.loads(body)
            if call.get("kind") == "forward_backward" and call.get("loss") == "ppo" and "loss_config" not in call:
                return self.reply(400, {"error": {"code": "invalid", "message": "ppo needs clip_low",
                                                  "field": "loss_config.clip_low"}})
            idem = self.headers.get("Idempotency-Key")
            with fake.lock:
                replayed = idem in fake.keys
                if not replayed:
                    fake.calls.append(call)
                    fake.keys[idem] = len(fake.calls)
                seq = fake.keys[idem]
            if drop:  # taken, but the answer is lost
                self.close_connection = True
                self.connection.shutdown(2)
                return None
            return self.reply(202, {"request_id": f"ses-1:{seq}", "seq": seq},
                              {"Idempotent-Replayed": "true"} if replayed else None)
        if self.command == "GET" and len(parts) == 5 and parts[3] == "calls":
            seq, wait = int(parts[4]), float(parse_qs(u.query).get("wait", ["30"])[0])
            with fake.lock:
                if seq < 1 or seq > len(fake.calls):
                    return self.reply(404, {"error": {"code": "not_found", "message": "no such call", "field": None}})
                fake.lock.wait_for(lambda: seq in fake.outcomes, timeout=min(wait, 0.2))
                ans = fake.outcomes.get(seq) or {"seq": seq, "kind": fake.calls[seq - 1]["kind"], "status": "pending"}
            return self.reply(200, ans)
        if self.command == "GET" and u.path == "/v1/sessions/ses-1":
            return self.reply(200, {"id": "ses-1", "state": "running", "step": 3, "calls_submitted": len(fake.calls),
                                    "calls_completed": len(fake.outcomes), "saved": []})
        if self.command == "DELETE" and u.path == "/v1/sessions/ses-1":
            return self.reply(202, {"id": "ses-1", "state": "running"})
        if self.command == "POST" and u.path == "/v1/sessions/ses-1/cancel":
            return self.reply(202, {"id": "ses-1", "state": "cancelled"})
        if self.command == "POST" and u.path == "/v1/tokenize":
            text = json.loads(body)["text"]
            return self.reply(200, {"tokens": [ord(c) for c in text]})
        if self.command == "POST" and u.path == "/v1/detokenize":
            return self.reply(200, {"text": "".join(chr(t) for t in json.loads(body)["tokens"])})
        if self.command == "POST" and u.path == "/v1/datasets":
            return self.reply(201, {"id": "ds-1", "name": parse_qs(u.query)["name"][0], "bytes": len(body)})
        if self.command == "POST" and u.path == "/v1/jobs":
            return self.reply(201, {"id": "job-1", "state": "submitted"})
        if self.command == "GET" and u.path == "/v1/jobs/job-1":
            with fake.lock:
                state = fake.job_states.pop(0) if len(fake.job_states) > 1 else fake.job_states[0]
            return self.reply(200, {"id": "job-1", "state": state})
        if self.command == "GET" and u.path in ("/v1/jobs/job-1/artifacts/adapter_model.safetensors",
                                                "/v1/sessions/ses-1/artifacts/adapter_model.safetensors"):
            return self.reply(200, raw=b"\x00weights\xff" * 1000)
        return self.reply(404, {"error": {"code": "not_found", "message": "no route", "field": None}})

    do_GET = do_POST = do_DELETE = do_PUT = handle_any


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.fake = Fake()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.fake = self.fake
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.service = lc.ServiceClient(base_url=self.url, api_key=KEY, timeout=10)

    def tearDown(self):
        self.server.shutdown()
        self.server.server_close()

    def reqs(self, method=None, path=None):
        with self.fake.lock:
            return [r for r in self.fake.requests if (method is None or r[0] == method) and
                    (path is None or r[1] == path)]

    def session(self):
        return self.service.create_lora_training_client("lathe-tiny", rank=4, alpha=8, targets=["q_proj", "v_proj"],
                                                         seed=42, priority="production")

    def test_create_session_body_and_auth(self):
        tc = self.session()
        self.assertEqual(tc.id, "ses-1")
        m, path, _, headers, body = self.reqs("POST", "/v1/sessions")[0]
        self.assertEqual(headers["Authorization"], f"Bearer {KEY}")
        self.assertEqual(headers["Content-Type"], "application/json")
        self.assertEqual(json.loads(body), {"base_model": "lathe-tiny", "seed": 42, "priority": "production",
                                            "lora": {"rank": 4, "alpha": 8, "dropout": 0.0,
                                                     "targets": ["q_proj", "v_proj"]}})
        # targets None: the field is left out (the server's default: all)
        self.service.create_lora_training_client("lathe-tiny")
        self.assertNotIn("targets", json.loads(self.reqs("POST", "/v1/sessions")[1][4])["lora"])

    def test_env_defaults(self):
        old = dict(os.environ)
        try:
            os.environ["LATHE_API_URL"], os.environ["LATHE_API_KEY"] = self.url + "/", KEY
            s = lc.ServiceClient()
            self.assertEqual(s.base_url, self.url)
            self.assertEqual(s.tokenize("m", "ab"), [97, 98])
            os.environ.pop("LATHE_API_URL")
            self.assertEqual(lc.ServiceClient(api_key="x").base_url, "http://127.0.0.1:8080")
        finally:
            os.environ.clear()
            os.environ.update(old)

    def test_calls_pipelined_in_order_results_later(self):
        tc = self.session()
        d = lc.sft_datum([1, 2, 3], [4, 5], eos=0)
        self.assertEqual(d.tokens, [1, 2, 3, 4, 5])
        self.assertEqual(d.targets, [2, 3, 4, 5, 0])
        self.assertEqual(d.weights, [0.0, 0.0, 1.0, 1.0, 1.0])
        futures = []
        for _ in range(3):
            futures.append(tc.forward_backward([d, {"tokens": [7, 8], "targets": [8, 9], "weights": [1, 1]}]))
            futures.append(tc.optim_step(lc.AdamParams(lr=1e-4, grad_clip=1.0)))
        # Six POSTs went out, in call order, and nothing has been polled yet.
        self.assertEqual([f.seq for f in futures], [1, 2, 3, 4, 5, 6])
        self.assertEqual([c["kind"] for c in self.fake.calls], ["forward_backward", "optim_step"] * 3)
        self.assertEqual(self.reqs("GET"), [])
        fb = self.fake.calls[0]
        self.assertEqual(fb, {"kind": "forward_backward", "loss": "cross_entropy",
                              "data": [{"tokens": [1, 2, 3, 4, 5], "targets": [2, 3, 4, 5, 0],
                                        "weights": [0.0, 0.0, 1.0, 1.0, 1.0]},
                                       {"tokens": [7, 8], "targets": [8, 9], "weights": [1, 1]}]})
        self.assertEqual(self.fake.calls[1], {"kind": "optim_step", "adam": {
            "lr": 1e-4, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0, "grad_clip": 1.0}})
        self.assertFalse(futures[0].done())
        # A waiter in another thread gets its result once the server finishes the call.
        got = {}
        waiter = threading.Thread(target=lambda: got.setdefault("r", futures[0].result(timeout=10)))
        waiter.start()
        time.sleep(0.3)
        self.assertNotIn("r", got)
        self.fake.finish(1, status="done", result={"loss": 2.5, "logprobs": [[-1.0] * 5, [-0.5] * 2], "tokens": 5},
                         duration_ms=12.3)
        waiter.join(10)
        self.assertEqual(got["r"].loss, 2.5)
        self.assertEqual(got["r"].tokens, 5)
        self.assertEqual(got["r"].logprobs[1], [-0.5, -0.5])
        self.assertEqual(futures[0].duration_ms, 12.3)
        self.fake.finish(2, status="done", result={"step": 1, "grad_norm": 0.7})
        r = futures[1].result(timeout=10)
        self.assertEqual((r.step, r.grad_norm), (1, 0.7))
        # the long poll asks the server to wait, bounded by the contract's 60 s
        waits = [float(q["wait"][0]) for _, p, q, _, _ in self.reqs("GET") if "/calls/" in p]
        self.assertTrue(waits and all(0 <= w <= 60 for w in waits), waits)
        # pending past the caller's timeout: CallTimeout (also a TimeoutError); the call stays pending
        t0 = time.monotonic()
        with self.assertRaises(TimeoutError):
            futures[2].result(timeout=0.5)
        self.assertLess(time.monotonic() - t0, 5)

    def test_concurrent_callers_get_distinct_ordered_seqs(self):
        tc = self.session()
        out = []
        lock = threading.Lock()

        def work(i):
            f = tc.save_state(f"s{i}")
            with lock:
                out.append((f.seq, f"s{i}"))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Each future's seq is the position of its own POST at the server.
        for seq, name in out:
            self.assertEqual(self.fake.calls[seq - 1], {"kind": "save_state", "name": name})
        self.assertEqual(sorted(s for s, _ in out), list(range(1, 17)))

    def test_post_400_is_invalid_request_with_field(self):
        tc = self.session()
        data = [{"tokens": [1], "targets": [2], "weights": [1.0]}]
        with self.assertRaises(lc.InvalidRequest) as cm:
            tc.forward_backward(data, loss_fn="ppo")
        self.assertEqual(cm.exception.field, "loss_config.clip_low")
        self.assertEqual(cm.exception.status, 400)
        self.assertEqual(cm.exception.code, "invalid")
        f = tc.forward_backward(data, loss_fn="ppo", loss_config={"clip_low": 0.2, "clip_high": 0.2})
        self.assertEqual(self.fake.calls[f.seq - 1]["loss_config"], {"clip_low": 0.2, "clip_high": 0.2})

    def test_local_checks_send_nothing(self):
        tc = self.session()
        n = len(self.reqs())
        with self.assertRaises(lc.InvalidRequest) as cm:
            tc.forward_backward([{"tokens": [1, 2], "targets": [2, 3], "weights": [1.0, 1.0]},
                                 {"tokens": [1, 2], "targets": [2, 3], "weights": [1.0]}])
        self.assertEqual(cm.exception.field, "data[1].weights")
        with self.assertRaises(lc.InvalidRequest) as cm:
            tc.forward_backward([{"tokens": [1], "targets": [2], "weights": [float("nan")]}])
        self.assertEqual(cm.exception.field, "data[0].weights")
        with self.assertRaises(lc.InvalidRequest):
            tc.forward_backward([{"tokens": [1.5], "targets": [2], "weights": [1]}])
        with self.assertRaises(lc.InvalidRequest) as cm:
            tc.forward([{"tokens": [1], "targets": [2], "weights": [1]}], loss_fn="mse")
        self.assertEqual(cm.exception.field, "loss")
        with self.assertRaises(lc.LatheError):
            tc.optim_step({"lr": float("inf")})
        self.assertEqual(len(self.reqs()), n)

    def test_failed_call_session_restarted(self):
        tc = self.session()
        f1 = tc.forward_backward([{"tokens": [1], "targets": [2], "weights": [1]}])
        f2 = tc.optim_step(lc.AdamParams(lr=1e-3))
        self.fake.finish(1, status="failed", error={"code": "session_restarted", "message": "worker lost",
                                                    "field": None, "resumed_from_step": 40})
        with self.assertRaises(lc.SessionRestarted) as cm:
            f1.result(timeout=10)
        e = cm.exception
        self.assertEqual((e.resumed_from_step, e.seq, e.code), (40, 1, "session_restarted"))
        self.assertIsInstance(e, lc.CallFailed)
        self.assertIsInstance(f1.exception(timeout=1), lc.SessionRestarted)
        # the outcome is kept: no second GET
        n = len(self.reqs("GET"))
        with self.assertRaises(lc.SessionRestarted):
            f1.result()
        self.assertEqual(len(self.reqs("GET")), n)
        self.fake.finish(2, status="failed", error={"code": "invalid", "message": "token 99999 outside the vocabulary",
                                                    "field": "data[0].tokens"})
        with self.assertRaises(lc.InvalidRequest) as cm:
            f2.result(timeout=10)
        self.assertIsInstance(cm.exception, lc.InvalidCall)
        self.assertEqual(cm.exception.field, "data[0].tokens")
        f3 = tc.save_state("x")
        self.fake.finish(3, status="failed", error={"code": "internal", "message": "disk full"})
        with self.assertRaises(lc.CallFailed) as cm:
            f3.result(timeout=10)
        self.assertNotIsInstance(cm.exception, lc.SessionRestarted)

    def test_a_calls_post_is_repeated_with_its_key_a_keyless_post_is_not(self):
        tc = self.session()
        path = "/v1/sessions/ses-1/calls"
        limited = (429, {"error": {"code": "rate_limited", "message": "slow down", "field": None}}, {"Retry-After": "0"})
        down = (503, {"error": {"code": "unavailable", "message": "broker", "field": None}}, {"Retry-After": "0"})
        busy = (409, {"error": {"code": "idempotency_key_in_use", "message": "being recorded", "field": None}},
                {"Retry-After": "0"})
        self.fake.script[("POST", path)] = [limited, down, busy]
        f = tc.save_state("a")
        posts = self.reqs("POST", path)
        keys = {r[3].get("Idempotency-Key") for r in posts}
        self.assertEqual((f.seq, len(posts), len(self.fake.calls), len(keys)), (1, 4, 1, 1))
        self.assertRegex(keys.pop(), r"^[0-9a-f]{32}$")
        # the answer lost after the server took the call: sent again with the same key, one call
        self.fake.script[("POST", path)] = [(0, None, None)]
        g = tc.save_state("b")
        posts = self.reqs("POST", path)[4:]
        self.assertEqual((g.seq, len(posts), len(self.fake.calls)), (2, 2, 2))
        self.assertEqual(posts[0][3]["Idempotency-Key"], posts[1][3]["Idempotency-Key"])
        self.assertNotEqual(posts[0][3]["Idempotency-Key"], self.reqs("POST", path)[0][3]["Idempotency-Key"])
        # the tries are bounded: RateLimited once they are spent, and the call may or may not be queued
        self.fake.script[("POST", path)] = [limited] * 9
        with self.assertRaises(lc.RateLimited):
            tc.save_state("c")
        self.assertEqual((len(self.reqs("POST", path)), len(self.fake.calls)), (6 + 5, 2))
        # still being recorded after every try: Unavailable (the outcome is not known), not Conflict
        self.fake.script[("POST", path)] = [busy] * 9
        with self.assertRaises(lc.Unavailable) as cm:
            tc.save_state("c")
        self.assertEqual((cm.exception.code, len(self.reqs("POST", path)), len(self.fake.calls)),
                         ("idempotency_key_in_use", 11 + 5, 2))
        # another conflict (the session ended) is not repeated
        self.fake.script[("POST", path)] = [(409, {"error": {"code": "session_ended", "message": "x"}}, None)]
        with self.assertRaises(lc.Conflict):
            tc.save_state("d")
        self.assertEqual(len(self.reqs("POST", path)), 17)
        # a session's creation carries a key too: sent again after a 503, under the same key
        self.fake.script[("POST", "/v1/sessions")] = [down]
        self.session()
        made = self.reqs("POST", "/v1/sessions")[1:]
        self.assertEqual(len(made), 2)
        self.assertEqual(made[0][3]["Idempotency-Key"], made[1][3]["Idempotency-Key"])
        self.assertNotEqual(made[0][3]["Idempotency-Key"], self.reqs("POST", "/v1/sessions")[0][3]["Idempotency-Key"])
        # a POST without a key (a job submitted without one) that may have been taken is never repeated
        self.fake.script[("POST", "/v1/jobs")] = [down]
        with self.assertRaises(lc.Unavailable):
            self.service.submit_job({"base_model": "m", "dataset_id": "ds-1"})
        self.assertEqual(len(self.reqs("POST", "/v1/jobs")), 1)
        # a long poll (a GET) is safe to repeat: after Retry-After it is
        f = tc.save_state("b")
        self.fake.finish(f.seq, status="done", result={"name": "b", "step": 0})
        self.fake.script[("GET", f"{path}/{f.seq}")] = [(429, {"error": {"code": "rate_limited", "message": "x"}},
                                                        {"Retry-After": "0"})]
        self.assertEqual(f.result(timeout=10).name, "b")
        self.assertEqual(len(self.reqs("GET", f"{path}/{f.seq}")), 2)

    def test_retry_429_opt_in(self):
        path = "/v1/jobs"  # a POST without a key
        svc = lc.ServiceClient(base_url=self.url, api_key=KEY, retry_429=True)
        limited = (429, {"error": {"code": "rate_limited", "message": "slow down"}}, {"Retry-After": "0"})
        self.fake.script[("POST", path)] = [limited, limited]
        self.assertEqual(svc.submit_job({"base_model": "m", "dataset_id": "ds-1"})["id"], "job-1")
        self.assertEqual(len(self.reqs("POST", path)), 3)
        # 503 may mean taken: never repeated without a key, even with retry_429
        self.fake.script[("POST", path)] = [(503, {"error": {"code": "unavailable", "message": "x"}},
                                             {"Retry-After": "0"})]
        with self.assertRaises(lc.Unavailable):
            svc.submit_job({"base_model": "m", "dataset_id": "ds-1"})
        self.assertEqual(len(self.reqs("POST", path)), 4)
        # without retry_429, a keyless POST's 429 raises at once
        self.fake.script[("POST", path)] = [limited]
        with self.assertRaises(lc.RateLimited):
            self.service.submit_job({"base_model": "m", "dataset_id": "ds-1"})
        self.assertEqual(len(self.reqs("POST", path)), 5)

    def test_errors_mapped(self):
        with self.assertRaises(lc.NotFound):
            self.service.training_client("ses-nope").state()
        with self.assertRaises(lc.AuthError):
            lc.ServiceClient(base_url=self.url, api_key="lt_wrong").tokenize("m", "x")
        self.fake.script[("DELETE", "/v1/sessions/ses-1")] = [(409, {"error": {"code": "ended", "message": "ended"}},
                                                                {})]
        with self.assertRaises(lc.Conflict):
            self.service.training_client("ses-1").end()
        self.fake.script[("GET", "/v1/jobs/job-9")] = [(500, None, {})]
        with self.assertRaises(lc.ServerError):
            self.service.get_job("job-9")
        # nothing listening: ConnectionFailed, promptly
        dead = lc.ServiceClient(base_url="http://127.0.0.1:9", api_key=KEY, timeout=2)
        with self.assertRaises(lc.ConnectionFailed):
            dead.training_client("ses-1").save_state("z")

    def test_sample_and_sampler(self):
        tc = self.session()
        w = tc.save_weights_for_sampler("w1")
        s = tc.sample([5, 6], num_samples=3, sampling_params=lc.SamplingParams(max_tokens=8, temperature=0.7,
                                                                                top_p=0.9, stop=[0], seed=11))
        self.assertEqual(self.fake.calls[w.seq - 1], {"kind": "save_weights_for_sampler", "name": "w1"})
        self.assertEqual(self.fake.calls[s.seq - 1], {"kind": "sample", "prompts": [[5, 6]], "num_samples": 3,
                                                      "max_tokens": 8, "temperature": 0.7, "top_p": 0.9,
                                                      "stop": [0], "seed": 11})
        self.fake.finish(w.seq, status="done", result={"name": "w1", "step": 7, "adapter": "ab" * 32})
        sampler = w.result(timeout=10)
        self.assertIsInstance(sampler, lc.SamplingClient)
        self.assertEqual((sampler.name, sampler.step), ("w1", 7))
        self.fake.finish(s.seq, status="done", result={"samples": [
            {"prompt": 0, "tokens": [9, 0], "logprobs": [-0.1, -0.2]}] * 3})
        out = s.result(timeout=10)
        self.assertEqual(len(out.samples), 3)
        self.assertEqual(out.for_prompt(0)[0].tokens, [9, 0])
        f = sampler.sample_many([[1], [2, 3]], num_samples=2)
        self.assertEqual(self.fake.calls[f.seq - 1]["prompts"], [[1], [2, 3]])
        with tempfile.TemporaryDirectory() as d:
            n = sampler.training.download_artifact("adapter_model.safetensors", os.path.join(d, "a.safetensors"))
            self.assertEqual(n, 9000)
            self.assertEqual(sorted(os.listdir(d)), ["a.safetensors"])

    def test_session_state_end_cancel_and_context(self):
        tc = self.session()
        self.assertEqual(tc.state()["step"], 3)
        self.fake.script[("DELETE", "/v1/sessions/ses-1")] = [(503, {"error": {"code": "unavailable",
                                                                               "message": "x"}}, {})]
        tc.end()  # the 503 is retried, under the same Idempotency-Key: one end
        tc.cancel()
        ends = self.reqs("DELETE", "/v1/sessions/ses-1")
        self.assertEqual(len(ends), 2)
        keys = {e[3].get("Idempotency-Key") for e in ends}
        self.assertEqual(len(keys), 1, keys)
        self.assertTrue(next(iter(keys)))
        self.assertEqual(len(self.reqs("POST", "/v1/sessions/ses-1/cancel")), 1)
        with self.assertRaises(RuntimeError):
            with self.session():
                raise RuntimeError("the loop broke")
        self.assertEqual(len(self.reqs("POST", "/v1/sessions/ses-1/cancel")), 2)
        with self.session():
            pass
        self.assertEqual(len(self.reqs("DELETE", "/v1/sessions/ses-1")), 3)

    def test_tokenizer_datasets_jobs(self):
        self.fake.script[("GET", "/v1/usage")] = [(200, {"tenant_id": "t", "quotas": {}, "usage": {"sessions": 2}}, {})]
        self.assertEqual(self.service.usage()["usage"]["sessions"], 2)
        self.assertEqual(len(self.reqs("GET", "/v1/usage")), 1)
        self.assertEqual(self.service.tokenize("lathe-tiny", "hi"), [104, 105])
        self.assertEqual(json.loads(self.reqs("POST", "/v1/tokenize")[0][4]), {"model": "lathe-tiny", "text": "hi"})
        self.assertEqual(self.service.detokenize("lathe-tiny", [104, 105]), "hi")
        self.assertEqual(json.loads(self.reqs("POST", "/v1/detokenize")[0][4]),
                         {"model": "lathe-tiny", "tokens": [104, 105]})
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "train.jsonl")
            lines = b'{"prompt":"a","completion":"b"}\n' * 100
            with open(p, "wb") as f:
                f.write(lines)
            r = self.service.upload_dataset(p, "mine")
            self.assertEqual((r["id"], r["name"], r["bytes"]), ("ds-1", "mine", len(lines)))
            _, _, q, h, body = self.reqs("POST", "/v1/datasets")[0]
            self.assertEqual((q["name"], h["Content-Type"], body), (["mine"], "application/x-ndjson", lines))
            spec = {"base_model": "lathe-tiny", "dataset_id": "ds-1", "hyperparameters": {"max_steps": 5}}
            self.assertEqual(self.service.submit_job(spec, idempotency_key="k1")["id"], "job-1")
            _, _, _, h, body = self.reqs("POST", "/v1/jobs")[0]
            self.assertEqual((json.loads(body), h["Idempotency-Key"]), (spec, "k1"))
            self.assertEqual(self.service.wait_job("job-1", timeout=10, poll=0.01)["state"], "completed")
            self.assertEqual(len(self.reqs("GET", "/v1/jobs/job-1")), 3)
            out = os.path.join(d, "adapter.safetensors")
            good = hashlib.sha256(b"\x00weights\xff" * 1000).hexdigest()
            self.assertEqual(self.service.download_artifact("job-1", "adapter_model.safetensors", out, sha256=good),
                             9000)
            with open(out, "rb") as f:
                self.assertEqual(f.read(), b"\x00weights\xff" * 1000)
            # other bytes than listed: an error and no file left behind
            bad = os.path.join(d, "bad.safetensors")
            with self.assertRaises(lc.LatheError):
                self.service.download_artifact("job-1", "adapter_model.safetensors", bad, sha256="00" * 32)
            self.assertFalse(os.path.exists(bad) or os.path.exists(bad + ".part"))


if __name__ == "__main__":
    result = unittest.main(argv=[sys.argv[0], "-v"], exit=False).result
    ok = result.wasSuccessful()
    print(f"client_python_unit: {'OK' if ok else 'FAILED'} ({result.testsRun} tests)")
    sys.exit(0 if ok else 1)
