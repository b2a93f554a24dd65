#!/usr/bin/python3
"""The sampler end to end (docs/DESIGN.md §2, sampler): `lathed --role all --sampler-port 0` on
the real stack (Kafka broker, object store) over the tiny base model. Two tenants fine-tune an
adapter each (managed jobs); then, through the OpenAI-compatible routes:

  1. completions from each adapter, greedy, give what the job's own evaluation samples
     (samples.json, made by the executor with the training engine) say the adapter answers;
     chat completions render the base model's own template; streaming (SSE, ending in
     `data: [DONE]`) gives the same text as the whole answer; logprobs come with the tokens;
  2. determinism: 64 requests with fixed seeds (temperature 0.9, top_p 0.95), sent one at a time,
     then all at once mixed with requests for the other adapter and the base model, give the same
     tokens and log-probs, bit for bit;
  3. isolation: tenant B cannot list, sample from or time-probe A's adapter (the 404 is the
     nonexistent job's, word for word, and the sampler's adapter cache is not consulted: its
     counters do not move); an inference key of A's limited to its adapter samples from it, is
     told of the base model what it is told of no model, and reaches none of A's jobs or data;
  4. bad input answers 400 naming the field; a client that goes away frees its request (lathed
     exits 0 at the end: in the sanitizer build, with no leak found);
  5. usage records on lathe.usage name tenant, model and counts, and carry no prompt or output;
  6. overload: a sampler with small queue bounds, sent 10x its bound of concurrent requests,
     answers 429 with Retry-After to the excess, serves the rest, and its peak memory stays within
     a few MiB of where it was before the burst; a seeded request gives there what it gave on the
     first sampler; a stream whose client reads nothing is cut once 64 KiB of it wait unread;
     killed mid-stream, it leaves a stream without [DONE];
  7. a live training session's save_weights_for_sampler is served as ft:<base>:<session>:<name>
     (greedy tokens and log-probs as the session's own sample gives them; 404 to another tenant;
     gone once the session ended, when its published adapter takes over as ft:<base>:<session>);
  8. the unmodified `openai` npm package (tests/reference) runs completions, chat completions and
     a stream against A's adapter (tests/sampler_openai.mjs).

usage: sampler_python.py PATH/TO/lathe PATH/TO/lathed
Environment: the stack's (`ops/stack env`), LATHE_E2E_CACHE. Exits non-zero on any failure."""
import concurrent.futures
import http.client
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import lt_test
from lt_test import BOOTSTRAP, ROOT, Child, admin_client, run

sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from lathe_client import AdamParams, SamplingParams, ServiceClient, sft_datum  # noqa: E402

CHECKS = []


def fail(msg):
    raise SystemExit(f"sampler: FAIL: {msg}")


def check(cond, what):
    if not cond:
        fail(what)
    CHECKS.append(what)
    print(f"sampler: ok: {what}", flush=True)


def http_json(base, key, method, path, body=None, timeout=120):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}"), dict(r.headers)
    except urllib.error.HTTPError as e:
        payload = e.read()
        try:
            return e.code, json.loads(payload), dict(e.headers)
        except ValueError:
            return e.code, {"raw": payload.decode(errors="replace")}, dict(e.headers)


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line.startswith("lathe_sampler_"):
                k, v = line.split()
                out[k] = float(v)
        return out


def model_dir(lathe, env):
    cache = os.environ.get("LATHE_E2E_CACHE") or "/tmp/lathe-e2e-models"
    d = os.path.join(cache, "lathe-tiny")
    # `lathe model make` adds the chat template to a model made before it had one.
    run([lathe, "model", "make", "--steps", "20", "--threads", "2", "--out", d], env, "lathe model make")
    return cache


def models_with_odd_template(cache, tmp):
    """The cache's lathe-tiny, and lathe-odd: the same files but a chat template using a float
    literal, which the server's template subset does not render."""
    d = os.path.join(tmp, "models")
    os.makedirs(os.path.join(d, "lathe-odd"))
    tiny = os.path.join(cache, "lathe-tiny")
    os.symlink(tiny, os.path.join(d, "lathe-tiny"))
    for f in os.listdir(tiny):
        if f != "tokenizer_config.json":
            os.symlink(os.path.join(tiny, f), os.path.join(d, "lathe-odd", f))
    with open(os.path.join(tiny, "tokenizer_config.json")) as f:
        conf = json.load(f)
    conf["chat_template"] = "{% for m in messages %}{{ m['content'] }} {{ 1.5 }}{% endfor %}"
    with open(os.path.join(d, "lathe-odd", "tokenizer_config.json"), "w") as f:
        json.dump(conf, f)
    return d


def train_adapter(lathe, env, key, tmp, name, seed, rank=4):
    """A managed fine-tune of the tiny model on its own task; returns the finished job's id."""
    src = os.path.join(env["LATHE_MODELS_DIR"], "lathe-tiny", "task_train.jsonl")
    path = os.path.join(tmp, f"{name}.jsonl")
    with open(src) as f, open(path, "w") as o:
        for i, line in enumerate(f):
            if i >= 200:
                break
            o.write(line)
    e = dict(env, LATHE_API_KEY=key)
    ds = json.loads(run([lathe, "datasets", "upload", path, "--name", name, "--json"], e, "datasets upload"))["id"]
    job = json.loads(run([lathe, "jobs", "submit", "--model", "lathe-tiny", "--dataset", ds, "--set", "max_steps=40",
                          "--set", "batch_size=8", "--set", "learning_rate=0.003", "--set", f"lora_rank={rank}",
                          "--set", "lora_dropout=0", "--set", f"seed={seed}", "--json"], e, "jobs submit"))["id"]
    return job


def wait_published(base, key, job, timeout=600):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, body, _ = http_json(base, key, "GET", f"/v1/jobs/{job}/artifacts")
        names = [a["name"] for a in body.get("artifacts", [])] if st == 200 else []
        if "adapter_model.safetensors" in names and "samples.json" in names:
            return
        if body.get("state") in ("failed", "cancelled"):
            fail(f"job {job} ended {body.get('state')}")
        time.sleep(1)
    fail(f"job {job} was not published within {timeout} s")


def samples_of(base, key, job):
    req = urllib.request.Request(f"{base}/v1/jobs/{job}/artifacts/samples.json",
                                 headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def complete(sbase, key, body):
    return http_json(sbase, key, "POST", "/v1/completions", body)


def stream_text(sbase, key, path, body):
    """A streamed answer: (the texts of its data chunks joined, whether it ended with [DONE])."""
    u = urllib.parse.urlparse(sbase)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    conn.request("POST", path, json.dumps(dict(body, stream=True)),
                 {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = conn.getresponse()
    text, done = [], False
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            break
        ch = json.loads(line[6:])["choices"]
        for c in ch:
            text.append(c.get("text") if "text" in c else (c.get("delta") or {}).get("content") or "")
    conn.close()
    return "".join(t or "" for t in text), done


def stream_logprobs(sbase, key, path, body):
    """A streamed answer's logprobs for choice 0, its chunks' joined as the whole answer holds them."""
    u = urllib.parse.urlparse(sbase)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    conn.request("POST", path, json.dumps(dict(body, stream=True)),
                 {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    merged = {}
    for raw in conn.getresponse():
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for c in json.loads(line[6:])["choices"]:
            for k, v in (c.get("logprobs") or {}).items():
                merged.setdefault(k, []).extend(v)
    conn.close()
    return merged


# ---- 1: answers ----

def answers(sbase, key_a, job_a, base, model_a):
    samples = samples_of(base, key_a, job_a)
    check(len(samples) >= 3, f"the job published {len(samples)} evaluation samples")
    same = 0
    for s in samples:
        st, body, _ = complete(sbase, key_a, {"model": model_a, "prompt": s["prompt"], "max_tokens": 24,
                                              "temperature": 0})
        if st != 200:
            fail(f"completion answered {st}: {body}")
        got = body["choices"][0]["text"]
        same += got.strip() == s["fine_tuned"].strip()
    check(same == len(samples), f"greedy completions from the adapter equal the job's own samples "
                                f"({same}/{len(samples)})")
    st, chat, _ = http_json(sbase, key_a, "POST", "/v1/chat/completions",
                            {"model": model_a, "messages": [{"role": "user", "content": samples[0]["prompt"]}],
                             "max_tokens": 24, "temperature": 0})
    check(st == 200 and chat["choices"][0]["message"]["content"].strip() == samples[0]["fine_tuned"].strip(),
          "chat completions render the model's own template (the plain prompt): the same answer")
    body = {"model": model_a, "prompt": samples[1]["prompt"], "max_tokens": 24, "temperature": 0}
    _, whole, _ = complete(sbase, key_a, body)
    text, done = stream_text(sbase, key_a, "/v1/completions", body)
    check(done and text == whole["choices"][0]["text"], "a stream ends in [DONE] and carries the whole answer's text")
    ctext, cdone = stream_text(sbase, key_a, "/v1/chat/completions",
                               {"model": model_a, "messages": [{"role": "user", "content": samples[1]["prompt"]}],
                                "max_tokens": 24, "temperature": 0})
    check(cdone and ctext == text, "a chat stream carries the same text")
    st, lp, _ = complete(sbase, key_a, dict(body, logprobs=3, n=2, temperature=0.7, seed=11))
    ok = st == 200 and len(lp["choices"]) == 2
    for c in lp["choices"] if ok else []:
        l = c["logprobs"]
        ok = ok and len(l["tokens"]) == len(l["token_logprobs"]) > 0 and all(x <= 0 for x in l["token_logprobs"])
        ok = ok and all(len(t) <= 3 for t in l["top_logprobs"])
    check(ok, "n=2 choices with logprobs (tokens, log-probs <= 0, up to 3 alternatives each)")
    _, whole, _ = complete(sbase, key_a, dict(body, logprobs=3))
    streamed = stream_logprobs(sbase, key_a, "/v1/completions", dict(body, logprobs=3))
    wl = whole["choices"][0]["logprobs"]
    differ = [k for k in set(streamed) | set(wl) if streamed.get(k) != wl.get(k)]
    check(streamed and not differ, "a stream's logprobs, joined, are the whole answer's (tokens, log-probs, alternatives, "
          f"offsets): {[(k, str(streamed.get(k))[:120], str(wl.get(k))[:120]) for k in differ]}")
    cbody = {"model": model_a, "messages": [{"role": "user", "content": samples[1]["prompt"]}], "max_tokens": 24,
             "temperature": 0, "logprobs": True, "top_logprobs": 2}
    _, cwhole, _ = http_json(sbase, key_a, "POST", "/v1/chat/completions", cbody)
    cstreamed = stream_logprobs(sbase, key_a, "/v1/chat/completions", cbody)
    check(cstreamed and cstreamed == cwhole["choices"][0]["logprobs"], "a chat stream's logprobs are the whole answer's")


# ---- 2: determinism ----

def one(sbase, key, model, i):
    st, body, _ = complete(sbase, key, {"model": model, "prompt": f"date: March {i % 28 + 1}, {1950 + i}\niso:",
                                        "max_tokens": 12, "temperature": 0.9, "top_p": 0.95, "seed": 1000 + i,
                                        "logprobs": 0})
    if st != 200:
        return ("error", st, json.dumps(body))
    lp = body["choices"][0]["logprobs"]
    return (body["choices"][0]["text"], tuple(lp["tokens"]), tuple(lp["token_logprobs"]))


def determinism(sbase, key_a, key_b, model_a, model_b):
    alone = [one(sbase, key_a, model_a, i) for i in range(64)]
    check(all(a[0] != "error" for a in alone), "64 seeded requests answered one at a time")
    with concurrent.futures.ThreadPoolExecutor(max_workers=48) as pool:
        futs = [pool.submit(one, sbase, key_a, model_a, i) for i in range(64)]
        noise = [pool.submit(one, sbase, key_b, model_b, i + 7) for i in range(16)]
        noise += [pool.submit(one, sbase, key_b, "lathe-tiny", i + 3) for i in range(16)]
        mixed = [f.result() for f in futs]
        for f in noise:
            f.result()
    diff = [i for i in range(64) if mixed[i] != alone[i]]
    check(not diff, f"the same 64 requests sent at once among other adapters' and the base model's give the same "
                    f"tokens and log-probs bit for bit (differing: {diff[:5]})")
    texts = {a[0] for a in alone}
    check(len(texts) > 8, f"the seeds matter: {len(texts)} distinct answers among 64")


# ---- 3: isolation ----

def isolation(sbase, ops, key_b, job_a, model_a):
    st, models, _ = http_json(sbase, key_b, "GET", "/v1/models")
    ids = [m["id"] for m in models.get("data", [])]
    check(st == 200 and "lathe-tiny" in ids and model_a not in ids and not any(job_a in i for i in ids),
          "tenant B's /v1/models lists the base model and not A's adapter")
    before = metrics(ops)
    st1, b1, _ = complete(sbase, key_b, {"model": model_a, "prompt": "x", "max_tokens": 2})
    fake = "ft:lathe-tiny:job-" + "0" * len(job_a.split("-", 1)[1]) if "-" in job_a else "ft:lathe-tiny:nope"
    st2, b2, _ = complete(sbase, key_b, {"model": fake, "prompt": "x", "max_tokens": 2})
    after = metrics(ops)
    m1 = b1["error"]["message"].replace(model_a, "MODEL")
    m2 = b2["error"]["message"].replace(fake, "MODEL")
    check(st1 == st2 == 404 and m1 == m2 and b1["error"]["code"] == b2["error"]["code"],
          "A's adapter answers B exactly as a job that does not exist (404, same code and message)")
    keys = ("lathe_sampler_adapter_hits_total", "lathe_sampler_adapter_misses_total",
            "lathe_sampler_adapter_loads_total", "lathe_sampler_requests_total")
    check(all(before[k] == after[k] for k in keys),
          "B's probes never reached the adapter cache (hits, misses, loads and requests unchanged): nothing to time")


def inference_key(lathe, env, base, sbase, tenant_a, key_a, job_a, model_a):
    """An inference key limited to A's adapter: samples from it as A's admin key does, is told of
    the base model what it is told of a model that does not exist, lists only its model, and on
    the API reaches none of A's jobs, artifacts or datasets (403 naming the role)."""
    out = json.loads(run([lathe, "admin", "tenant", "add-key", tenant_a, "--role", "inference", "--label", "app",
                          "--model", model_a, "--json"], env, "add-key --role inference"))
    ikey = out["api_key"]
    deadline = time.time() + 30
    while http_json(sbase, ikey, "GET", "/v1/models")[0] != 200:
        if time.time() > deadline:
            fail("the sampler never accepted the new inference key")
        time.sleep(0.2)
    st, models, _ = http_json(sbase, ikey, "GET", "/v1/models")
    ids = [m["id"] for m in models.get("data", [])]
    check(st == 200 and ids == [model_a], f"the inference key's /v1/models lists its one model only: {ids}")
    body = {"model": model_a, "prompt": "date: 2021-03-04 ->", "max_tokens": 6, "temperature": 0}
    st1, b1, _ = complete(sbase, ikey, body)
    st2, b2, _ = complete(sbase, key_a, body)
    check(st1 == st2 == 200 and b1["choices"][0]["text"] == b2["choices"][0]["text"],
          "the inference key samples A's adapter as A's admin key does")
    st1, b1, _ = complete(sbase, ikey, {"model": "lathe-tiny", "prompt": "x", "max_tokens": 2})
    st2, b2, _ = complete(sbase, ikey, {"model": "no-such-model", "prompt": "x", "max_tokens": 2})
    check(st1 == st2 == 404 and b1["error"]["message"].replace("lathe-tiny", "M") ==
          b2["error"]["message"].replace("no-such-model", "M"),
          "a model outside the key's list answers as one that does not exist (404, same message)")
    st1, b1, _ = complete(sbase, ikey, {"model": f"{model_a}:ckpt-step-1", "prompt": "x", "max_tokens": 2})
    check(st1 == 404 and b1["error"]["message"].replace(f"{model_a}:ckpt-step-1", "M") ==
          b2["error"]["message"].replace("no-such-model", "M"),
          "a checkpoint of the key's own adapter, not listed, answers as no model")
    st, _, _ = complete(sbase, key_a, {"model": "lathe-tiny", "prompt": "x", "max_tokens": 2})
    check(st == 200, "A's admin key still samples the base model")
    st, tok, _ = http_json(sbase, ikey, "POST", "/v1/tokenize", {"model": "lathe-tiny", "text": "date"})
    check(st == 200 and tok.get("tokens"), "the key tokenizes with its adapter's base model")
    other = json.loads(run([lathe, "admin", "tenant", "add-key", tenant_a, "--role", "inference",
                            "--model", "ft:other-base:job-1", "--json"], env, "add-key --role inference"))["api_key"]
    deadline = time.time() + 30
    while http_json(sbase, other, "GET", "/v1/models")[0] != 200:
        if time.time() > deadline:
            fail("the sampler never accepted the second inference key")
        time.sleep(0.2)
    st1, b1, _ = http_json(sbase, other, "POST", "/v1/tokenize", {"model": "lathe-tiny", "text": "date"})
    st2, b2, _ = http_json(sbase, other, "POST", "/v1/tokenize", {"model": "no-such-base", "text": "date"})
    check(st1 == st2 == 404 and b1["error"]["message"].replace("lathe-tiny", "M") ==
          b2["error"]["message"].replace("no-such-base", "M"),
          "a key limited to another base's adapter is told of this base's tokenizer what it is told of none")
    for method, path in (("GET", f"/v1/jobs/{job_a}"), ("GET", f"/v1/jobs/{job_a}/artifacts/samples.json"),
                         ("GET", f"/v1/jobs/{job_a}/checkpoints"), ("GET", "/v1/datasets"), ("POST", "/v1/jobs")):
        st, b, _ = http_json(base, ikey, method, path, {} if method == "POST" else None)
        check(st == 403 and "inference key" in b.get("error", {}).get("message", ""),
              f"the inference key's {method} {path} on the API: 403 naming its role")
    return ikey


# ---- 4: bad input, a client that leaves ----

def bad_input(sbase, key):
    cases = [({"model": "lathe-tiny", "prompt": "x", "max_tokens": 0}, "max_tokens"),
             ({"model": "lathe-tiny", "prompt": "x", "temperature": "hot"}, "temperature"),
             ({"model": "lathe-tiny", "prompt": "x", "colour": 1}, "colour"),
             ({"model": "lathe-tiny", "prompt": 7}, "prompt"),
             ({"model": "lathe-tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
             ({"model": "lathe-tiny", "prompt": "x", "top_p": 0}, "top_p"),
             ({"model": "lathe-tiny", "prompt": "date " * 300, "max_tokens": 8}, "prompt"),
             ({"model": "lathe-tiny", "prompt": "x", "echo": 0}, "echo"),
             ({"model": "lathe-tiny", "prompt": "x", "seed": 1.5}, "seed"),
             ({"model": "lathe-tiny", "prompt": "x", "seed": "7"}, "seed")]
    for body, field in cases:
        st, b, _ = complete(sbase, key, body)
        check(st == 400 and b["error"].get("field") == field, f"400 naming {field} ({b['error']['message'][:60]})")
    # chat: max_tokens beside max_completion_tokens is checked too, not ignored
    st, b, _ = http_json(sbase, key, "POST", "/v1/chat/completions",
                         {"model": "lathe-tiny", "messages": [{"role": "user", "content": "x"}],
                          "max_completion_tokens": 4, "max_tokens": "x"})
    check(st == 400 and b["error"].get("field") == "max_tokens", f"400 naming max_tokens beside max_completion_tokens ({st})")
    # a negative seed, and one past 2^53, are seeds like any other: the same answer twice
    # (four times at temperature 1.5: four fresh random seeds would hardly agree on 24 tokens)
    for seed in (-5, 2**63 - 1):
        body = {"model": "lathe-tiny", "prompt": "date:", "max_tokens": 24, "temperature": 1.5, "seed": seed}
        got = [complete(sbase, key, body) for _ in range(4)]
        check(all(st == 200 for st, _, _ in got) and len({b["choices"][0]["text"] for _, b, _ in got}) == 1,
              f"seed {seed} gives the same text four times ({[st for st, _, _ in got]})")
    st, b, _ = complete(sbase, key, {"model": "no-such-model", "prompt": "x"})
    check(st == 404 and b["error"]["field"] == "model", "an unknown model is 404 naming model")
    # a base model whose chat template the server cannot render: 400 naming model (a 500 would be
    # retried by clients, to the same answer), and its plain completions are served
    st, b, _ = http_json(sbase, key, "POST", "/v1/chat/completions",
                         {"model": "lathe-odd", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    msg = b.get("error", {}).get("message", "")
    check(st == 400 and b["error"].get("field") == "model" and "floating-point" in msg and "/v1/completions" in msg,
          f"a chat template outside the subset is 400 naming model and the construct ({st} {msg[:120]})")
    st, b, _ = complete(sbase, key, {"model": "lathe-odd", "prompt": "date:", "max_tokens": 2})
    check(st == 200 and len(b.get("choices", [])) == 1, f"that model's plain completions are served ({st})")
    # The tokenizer takes what a completion takes (its work holds the event loop; 8 MiB held it
    # over a second): past that, 413 naming the limit, and the next request is served
    for path, body in (("/v1/tokenize", {"model": "lathe-tiny", "text": "date " * 200000}),
                       ("/v1/detokenize", {"model": "lathe-tiny", "tokens": [5] * 100000})):
        st, b, _ = http_json(sbase, key, "POST", path, body)
        check(st == 413 and "over the limit of 65536" in b.get("error", {}).get("message", ""),
              f"{path} of a body over the JSON limit is 413 naming it ({st} {str(b)[:80]})")
    st, tok, _ = http_json(sbase, key, "POST", "/v1/tokenize", {"model": "lathe-tiny", "text": "date " * 6000})
    st2, txt, _ = http_json(sbase, key, "POST", "/v1/detokenize", {"model": "lathe-tiny", "tokens": tok.get("tokens", [])})
    check(st == st2 == 200 and len(tok["tokens"]) > 1000 and txt.get("text") == "date " * 6000,
          f"a body under the limit tokenizes and detokenizes back whole ({st} {st2})")


def long_stream(sbase, key, model):
    """A long streamed request, read up to its first line: (connection, response)."""
    u = urllib.parse.urlparse(sbase)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"model": model, "prompt": "date:", "max_tokens": 200,
                                                        "temperature": 1, "stream": True, "stop": ["\x01"]}),
                 {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = conn.getresponse()
    r.fp.readline()
    return conn, r


def client_leaves(sbase, ops, key, model):
    """A client that closes its stream after the first chunk. On a loaded machine the tiny model can
    generate all 200 tokens before the sampler sees the socket close; such a try says nothing about
    cancelling (its request finished, counted as finished), so it is tried again, up to 5 times."""
    for attempt in range(5):
        before = metrics(ops)
        conn, _ = long_stream(sbase, key, model)
        conn.sock.close()
        conn.close()
        deadline, m = time.time() + 20, before
        while time.time() < deadline:
            m = metrics(ops)
            ended = (m["lathe_sampler_cancelled_total"] > before["lathe_sampler_cancelled_total"]
                     or m["lathe_sampler_finished_total"] > before["lathe_sampler_finished_total"])
            if ended and m["lathe_sampler_running"] == 0:
                break
            time.sleep(0.1)
        cancelled = m["lathe_sampler_cancelled_total"] > before["lathe_sampler_cancelled_total"]
        freed = m["lathe_sampler_running"] == 0 and m["lathe_sampler_kv_blocks_free"] == m["lathe_sampler_kv_blocks_capacity"]
        check(freed, f"the stream's slot and cache blocks are freed once it ended (try {attempt + 1})")
        if cancelled:
            break
        print(f"sampler: note: try {attempt + 1}: the stream ran to its end before the close was seen; again")
    check(cancelled, "a streaming client that goes away is cancelled and its cache blocks freed")


# ---- 5: usage records ----

def key_id(key):
    """The id of an API key lt_<key_id>_<secret>."""
    return key.split("_")[1]


def usage(lathe, env, tenant_a, secret_prompt, key_a, ikey):
    p = subprocess.run([lathe, "topic", "tail", "usage", "--from-beginning", "--max", "1000", "--timeout-ms", "5000"],
                       env=env, capture_output=True, text=True, timeout=60)
    out = p.stdout
    recs = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    mine = [r for r in recs if r.get("record", {}).get("tenant_id") == tenant_a]
    check(len(mine) > 64, f"usage records name the tenant ({len(mine)} of {len(recs)} for A)")
    v = mine[0]["record"]
    check(v["tokens_out"] > 0 and v["tokens_in"] > 0 and v["base_model"] == "lathe-tiny",
          "a usage record carries the model and token counts")
    gone = [r["record"] for r in mine if r["record"].get("finish") == "cancelled"]
    check(gone and all(g["tokens_in"] > 0 and g["tokens_out"] > 0 for g in gone),
          f"a stream its client left is billed what it read and generated ({[(g['tokens_in'], g['tokens_out']) for g in gone]})")
    check(secret_prompt not in out, "no usage record carries a prompt")
    by_key = {}
    for r in mine:
        by_key[r["record"].get("api_key_id")] = by_key.get(r["record"].get("api_key_id"), 0) + 1
    check(by_key.get(key_id(ikey), 0) == 1 and by_key.get(key_id(key_a), 0) == len(mine) - 1,
          f"each usage record names the key that sent it: the inference key's one answered request, the admin key's rest ({by_key})")
    other = [r for r in recs if r.get("record", {}).get("tenant_id") != tenant_a]
    check(other and not any(r["record"].get("api_key_id") in (key_id(key_a), key_id(ikey)) for r in other),
          "no other tenant's usage record names A's keys")


# ---- 6: overload ----

def vm_hwm(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


LONG_SEEDED = {"model": "lathe-tiny", "messages": [{"role": "user", "content": "date:"}], "max_tokens": 200, "n": 6,
               "logprobs": True, "top_logprobs": 20, "temperature": 1, "seed": 4242, "stream": True,
               "stop": ["\x01"]}


def unread_stream(port, key, ops, main_sbase):
    """A stream whose client reads nothing (a small receive buffer) is cut once 64 KiB of it wait
    on the sampler's side (LATHE_API_STREAM_BACKLOG): counted, logged, and the client finds the
    stream ended without [DONE]. Before, the sampler held the whole answer for it. The request is
    seeded, so its whole answer, read on the first sampler, is the size the cut works against."""
    u = urllib.parse.urlparse(main_sbase)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps(LONG_SEEDED),
                 {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    whole = conn.getresponse().read()
    conn.close()
    check(b"[DONE]" in whole and len(whole) > 2 * 65536,
          f"read as it comes, the seeded stream is whole and long enough to be cut ({len(whole)} bytes)")
    def cut():
        with urllib.request.urlopen(ops + "/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("lathe_api_streams_cut_total "):
                    return float(line.split()[1])
        return 0.0
    before = cut()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    body = json.dumps(LONG_SEEDED).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    deadline = time.time() + 60
    while time.time() < deadline and cut() == before:
        time.sleep(0.2)
    n_cut = cut() - before
    s.settimeout(30)
    got = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
    except OSError:
        pass
    s.close()
    check(n_cut == 1, f"the unread stream is cut and counted ({n_cut:.0f}; {len(got)} bytes came: {got[:200]!r})")
    check(got.startswith(b"HTTP/1.1 200") and b"[DONE]" not in got and len(got) < 4 << 20,
          f"its client finds the stream ended without [DONE] ({len(got)} bytes came)")


def other_base(lathed, env, key, model, log_tag):
    """A sampler that serves lathe-odd alone: the tenant's lathe-tiny adapter is not in its
    /v1/models, and asking for it is 404 saying the base is not served here. Before, it was listed,
    and each request read and decrypted the adapter to be told 503 "retry"."""
    odd_only = os.path.join(os.path.dirname(env["LATHE_MODELS_DIR"]), "models-odd")
    os.makedirs(odd_only, exist_ok=True)
    if not os.path.exists(os.path.join(odd_only, "lathe-odd")):
        os.symlink(os.path.join(env["LATHE_MODELS_DIR"], "lathe-odd"), os.path.join(odd_only, "lathe-odd"))
    c = Child("lathed sampler (lathe-odd)", [lathed, "--role", "sampler", "--port", "0", "--operator-port", "0"],
              dict(env, LATHE_INSTANCE=f"{log_tag}-s3", LATHE_MODELS_DIR=odd_only, LATHE_API_KEY_RATE="off",
                   LATHE_API_TENANT_RATE="off"))
    try:
        port = int(c.wait_for(r"sampler listening on http://127\.0\.0\.1:(\d+)", 120).group(1))
        sbase = f"http://127.0.0.1:{port}"
        ids = []
        for _ in range(100):  # 503 until its API has read the log
            st, body, _ = http_json(sbase, key, "GET", "/v1/models")
            ids = [m["id"] for m in body.get("data", [])] if st == 200 else []
            if st == 200:
                break
            time.sleep(0.2)
        check(ids and "lathe-odd" in ids and not any("lathe-tiny" in i for i in ids),
              f"a sampler lists only adapters of the base models it serves ({ids})")
        st, b, _ = complete(sbase, key, {"model": model, "prompt": "x", "max_tokens": 2})
        msg = b.get("error", {}).get("message", "")
        check(st == 404 and b["error"].get("field") == "model" and "not served by this sampler" in msg,
              f"an adapter of a base model the sampler does not serve is 404 saying so ({st} {msg[:90]})")
    finally:
        c.stop()


def overload(lathed, env, key, model, log_tag, main_sbase):
    c = Child("lathed sampler", [lathed, "--role", "sampler", "--port", "0", "--operator-port", "0"],
              dict(env, LATHE_INSTANCE=f"{log_tag}-s2", LATHE_SAMPLER_QUEUE_PER_TENANT="8",
                   LATHE_SAMPLER_QUEUE_TOTAL="8", LATHE_SAMPLER_MAX_RUNNING="4", LATHE_API_KEY_RATE="off",
                   LATHE_API_TENANT_RATE="off", LATHE_API_STREAM_BACKLOG="65536"))
    try:
        port = int(c.wait_for(r"sampler listening on http://127\.0\.0\.1:(\d+)", 120).group(1))
        ops = int(c.wait_for(r"sampler operator endpoints \(\S+, \S+\) at http://127\.0\.0\.1:(\d+)", 120).group(1))
        sbase = f"http://127.0.0.1:{port}"
        for _ in range(100):
            st, _, _ = http_json(sbase, key, "GET", "/v1/models")
            if st == 200:
                break
            time.sleep(0.2)
        complete(sbase, key, {"model": model, "prompt": "date:", "max_tokens": 4})  # adapter loaded, warm
        hwm0 = vm_hwm(c.p.pid)
        with concurrent.futures.ThreadPoolExecutor(max_workers=80) as pool:
            res = list(pool.map(lambda i: complete(sbase, key, {"model": model, "prompt": f"date: May {i % 28 + 1}, 1999\niso:",
                                                                "max_tokens": 16, "temperature": 0}), range(80)))
        hwm1 = vm_hwm(c.p.pid)
        codes = [r[0] for r in res]
        n429 = codes.count(429)
        check(n429 > 0 and codes.count(200) > 0 and set(codes) <= {200, 429},
              f"80 concurrent requests against a bound of 8: {codes.count(200)} served, {n429} answered 429")
        check(all(r[2].get("Retry-After") for r in res if r[0] == 429), "every 429 says Retry-After")
        check(hwm1 - hwm0 < 32 * 1024, f"peak memory grew {(hwm1 - hwm0) / 1024:.1f} MiB under the burst (< 32)")
        here, there = one(sbase, key, model, 5), one(main_sbase, key, model, 5)
        check(here == there and here[0] != "error",
              "the same seeded request gives the same tokens and log-probs on another sampler process")
        unread_stream(port, key, f"http://127.0.0.1:{ops}", main_sbase)
        c.wait_for(r"stream cut, its client left over 65536 bytes unread", 10)
        # A sampler killed mid-stream: the client sees the stream end without [DONE].
        conn, r = long_stream(sbase, key, model)
        c.p.kill()
        rest = b""
        try:
            rest = r.read()
        except (http.client.IncompleteRead, ConnectionError) as e:
            rest = getattr(e, "partial", b"") or b""
        conn.close()
        check(b"[DONE]" not in rest, "a sampler killed mid-stream leaves a stream without [DONE]: the client can tell")
    finally:
        c.stop()


# ---- 7: a live session's weights ----

def session_weights(base, sbase, key_a, key_b):
    svc = ServiceClient(base_url=base, api_key=key_a, timeout=120)
    prompt = "date: March 5, 2021\niso:"
    tok = svc.tokenize("lathe-tiny", prompt)
    batch = [sft_datum(tok, svc.tokenize("lathe-tiny", " 2021-03-05"))]
    tc = svc.create_lora_training_client("lathe-tiny", rank=4, alpha=8, seed=5)
    for _ in range(3):
        tc.forward_backward(batch)
        tc.optim_step(AdamParams(lr=5e-2))
    tc.save_weights_for_sampler("w1").result(timeout=300)
    own = tc.sample(tok, 1, SamplingParams(max_tokens=8, temperature=0, seed=1)).result(timeout=300).samples[0]
    model = f"ft:lathe-tiny:{tc.id}:w1"
    st, models, _ = http_json(sbase, key_a, "GET", "/v1/models")
    check(st == 200 and model in [m["id"] for m in models["data"]], f"/v1/models lists the live session's {model}")
    st, body, _ = complete(sbase, key_a, {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0,
                                          "logprobs": 0})
    lp = body["choices"][0]["logprobs"] if st == 200 else {"tokens": [], "token_logprobs": []}
    n = len(lp["tokens"])
    theirs = [svc.detokenize("lathe-tiny", [t]) for t in own.tokens[:n]]
    close = all(abs(a - b) < 1e-3 for a, b in zip(lp["token_logprobs"], own.logprobs))
    check(st == 200 and n > 0 and lp["tokens"] == theirs and close,
          f"the sampler serves the session's saved weights: its greedy tokens and log-probs ({n}) are the session's own")
    st, b, _ = complete(sbase, key_b, {"model": model, "prompt": prompt, "max_tokens": 2})
    check(st == 404, "another tenant gets 404 for the session's saved weights")
    tc.end()
    tc.wait_until(timeout=300)
    st, b, _ = complete(sbase, key_a, {"model": model, "prompt": prompt, "max_tokens": 2})
    check(st == 404, "after the session ended its live weights are gone (404)")
    deadline = time.time() + 120
    while time.time() < deadline:
        st, b, _ = complete(sbase, key_a, {"model": f"ft:lathe-tiny:{tc.id}", "prompt": prompt, "max_tokens": 2})
        if st == 200:
            break
        time.sleep(1)
    check(st == 200, "the ended session's published adapter is served as ft:lathe-tiny:<session>")


# ---- 7b: a deleted job's adapter ----

def deleted_job(base, sbase, ops, key_b, job_b, model_b):
    """Tenant B deletes its job: its adapter answers 404 and leaves the sampler's cache (zeroed),
    rather than staying there until the LRU evicts it."""
    st, _, _ = complete(sbase, key_b, {"model": model_b, "prompt": "x", "max_tokens": 2})
    check(st == 200, "tenant B's adapter is served (and cached) before its job is deleted")
    before = metrics(ops).get("lathe_sampler_adapter_forgotten_total", 0)
    st, body, _ = http_json(base, key_b, "DELETE", f"/v1/jobs/{job_b}")
    check(st == 200 and body.get("deleted"), f"tenant B deletes its job ({st})")
    deadline = time.time() + 30  # the sampler's API reads the JobDeleted from the log a moment later
    while time.time() < deadline:
        st, _, _ = complete(sbase, key_b, {"model": model_b, "prompt": "x", "max_tokens": 2})
        if st == 404:
            break
        time.sleep(0.2)
    check(st == 404, f"the deleted job's adapter answers 404 ({st})")
    deadline = time.time() + 30
    while time.time() < deadline and metrics(ops).get("lathe_sampler_adapter_forgotten_total", 0) <= before:
        time.sleep(0.2)
    after = metrics(ops).get("lathe_sampler_adapter_forgotten_total", 0)
    check(after == before + 1, f"the deleted job's adapter left the sampler's cache ({before:.0f} -> {after:.0f})")


def unservable(sbase, ops, key, base, job):
    """An adapter the sampler can never serve (rank 256 on a base model of hidden size 192, which
    training takes and serving does not) is 400 naming model and why, not 503 "retry"; a retry is
    answered at once, without the adapter read and parsed again."""
    wait_published(base, key, job)
    model = f"ft:lathe-tiny:{job}"
    st, b, _ = complete(sbase, key, {"model": model, "prompt": "x", "max_tokens": 2})
    msg = b.get("error", {}).get("message", "")
    check(st == 400 and b["error"].get("field") == "model" and "hidden size" in msg,
          f"an adapter that cannot be served is 400 naming model and why ({st} {msg[:100]})")
    misses = metrics(ops).get("lathe_sampler_adapter_misses_total", 0)
    st2, b2, _ = complete(sbase, key, {"model": model, "prompt": "x", "max_tokens": 2})
    check(st2 == 400 and b2["error"].get("message") == msg
          and metrics(ops).get("lathe_sampler_adapter_misses_total", 0) == misses,
          f"a retry is refused the same, without asking the sampler's cache again ({st2})")


# ---- 8: the openai npm package ----

def openai_npm(sbase, key, model, expect):
    script = os.path.join(ROOT, "tests", "sampler_openai.mjs")
    if not os.path.isdir(os.path.join(ROOT, "tests", "reference", "node_modules", "openai")):
        fail("tests/reference/node_modules/openai is missing: run ops/setup")
    p = subprocess.run(["node", script, sbase + "/v1", key, model, expect["prompt"]], capture_output=True, text=True,
                       timeout=180)
    if p.returncode != 0:
        fail(f"the openai package run failed: {p.stderr.strip()[-800:]}")
    out = json.loads(p.stdout)
    want = expect["fine_tuned"].strip()
    check(out["completion"].strip() == want and out["chat"].strip() == want and out["stream"].strip() == want,
          f"the unmodified openai npm package ({out['version']}) gets the adapter's answer by completion, chat and stream")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: sampler_python.py PATH/TO/lathe PATH/TO/lathed")
    lathe, lathed = sys.argv[1], sys.argv[2]
    admin = admin_client(fail)
    run_id = f"{os.getpid()}{secrets.token_hex(3)}"
    prefix = f"tsam{run_id}."
    env = dict(os.environ, LATHE_KAFKA_BOOTSTRAP=BOOTSTRAP, LATHE_TOPIC_PREFIX=prefix, LATHE_SOURCE_ROOT=ROOT)
    tmp = tempfile.mkdtemp(prefix="lathe-sampler-")
    env["LATHE_MODELS_DIR"] = models_with_odd_template(model_dir(lathe, env), tmp)
    d = None
    try:
        run([lathe, "admin", "topics"], env, "lathe admin topics")
        tenants, keys = [], []
        for t in ("a", "b"):
            out = json.loads(run([lathe, "admin", "tenant", "create", f"sam{t}{run_id}", "--json"], env, "tenant create"))
            tenants.append(out["tenant_id"] if "tenant_id" in out else f"sam{t}{run_id}")
            keys.append(out["api_key"])
        d = Child("lathed", [lathed, "--role", "all", "--port", "0", "--operator-port", "0", "--sampler-port", "0"],
                  dict(env, LATHE_INSTANCE=f"sam{run_id}", LATHE_API_KEY_RATE="off", LATHE_API_TENANT_RATE="off",
                       LATHE_WORKER_SLOTS="2", LATHE_SAMPLER_QUEUE_PER_TENANT="128", LATHE_SAMPLER_QUEUE_TOTAL="256",
                       LATHE_SAMPLER_THREADS="2"))
        port = int(d.wait_for(r"api listening on http://127\.0\.0\.1:(\d+)", 120).group(1))
        sport = int(d.wait_for(r"sampler listening on http://127\.0\.0\.1:(\d+)", 120).group(1))
        sops = int(d.wait_for(r"sampler operator endpoints \(/healthz, /metrics\) at http://127\.0\.0\.1:(\d+)", 10).group(1))
        d.wait_for(r"scheduler: leading \(", 90)
        base, sbase, ops = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{sport}", f"http://127.0.0.1:{sops}"
        try:
            job_a = train_adapter(lathe, dict(env, LATHE_API_URL=base), keys[0], tmp, "a", 7)
            job_b = train_adapter(lathe, dict(env, LATHE_API_URL=base), keys[1], tmp, "b", 8)
            job_wide = train_adapter(lathe, dict(env, LATHE_API_URL=base), keys[0], tmp, "wide", 9, rank=256)
            wait_published(base, keys[0], job_a)
            wait_published(base, keys[1], job_b)
            model_a, model_b = f"ft:lathe-tiny:{job_a}", f"ft:lathe-tiny:{job_b}"
            answers(sbase, keys[0], job_a, base, model_a)
            determinism(sbase, keys[0], keys[1], model_a, model_b)
            isolation(sbase, ops, keys[1], job_a, model_a)
            ikey = inference_key(lathe, env, base, sbase, tenants[0], keys[0], job_a, model_a)
            bad_input(sbase, keys[0])
            client_leaves(sbase, ops, keys[0], model_a)
            secret = "date: zz-secret-prompt-" + secrets.token_hex(4)
            complete(sbase, keys[0], {"model": model_a, "prompt": secret, "max_tokens": 3})
            usage(lathe, env, tenants[0], secret, keys[0], ikey)
            session_weights(base, sbase, keys[0], keys[1])
            deleted_job(base, sbase, ops, keys[1], job_b, model_b)
            unservable(sbase, ops, keys[0], base, job_wide)
            openai_npm(sbase, keys[0], model_a, samples_of(base, keys[0], job_a)[0])
            other_base(lathed, env, keys[0], model_a, f"sam{run_id}")
            overload(lathed, env, keys[0], model_a, f"sam{run_id}", sbase)
            check(d.stopped_clean(), f"lathed exits 0 with nothing left behind (status {d.p.returncode}): "
                  "every stream a client left was freed")
        except BaseException:
            d.dump()
            raise
    finally:
        if d:
            d.stop()
        lt_test.delete_topics(admin, prefix)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"sampler: {len(CHECKS)} checks passed")


if __name__ == "__main__":
    import urllib.parse  # noqa: F401  (http.client users above)
    main()
