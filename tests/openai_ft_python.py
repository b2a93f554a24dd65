#!/usr/bin/python3
"""OpenAI's fine-tuning API on the real stack, driven by the unmodified `openai` npm package.

Against `lathed --role all` on the stack's broker and object store:
  1. tests/openai_ft.mjs uploads a file, creates a job (n_epochs 1, a suffix, metadata, a seed),
     cancels a second one, lists jobs newest first, polls to succeeded, reads the events and the
     checkpoints, lists files and models, and provokes the errors a client gets wrong;
  2. every answer is checked here: OpenAI's objects and statuses, the model name the sampler serves,
     the hyperparameters mapped both ways, events newest first without duplicates across pages,
     checkpoints with their metrics, errors with OpenAI's status, type and param;
  3. tenant B reaches none of A's files or jobs through these routes (404, as for ids that do not
     exist), and A's job is the same job on the native API (its suffix and metadata recorded);
  4. a job checkpointing every 5 steps: each checkpoint retention keeps samples under the name
     the listing gives it, a pruned one is 404 "no longer kept", tenant B's tries are 404.

usage: openai_ft_python.py PATH/TO/lathe PATH/TO/lathed
Environment: the stack's (`ops/stack env`), LATHE_E2E_CACHE. Exits non-zero on any failure."""
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import lt_test
from lt_test import BOOTSTRAP, ROOT, Child, admin_client, run

T = lt_test.Checks("openai_ft")
check, fail = T.check, T.fail


def http_json(base, key, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def run_npm(base, key, path):
    if not os.path.isdir(os.path.join(ROOT, "tests", "reference", "node_modules", "openai")):
        fail("tests/reference/node_modules/openai is missing: run ops/setup")
    p = subprocess.run(["node", os.path.join(ROOT, "tests", "openai_ft.mjs"), base + "/v1", key, path],
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        fail(f"the openai package run failed: {p.stderr.strip()[-1500:]}")
    return json.loads(p.stdout)


def check_npm(out, path):
    f = out["file"]
    check(f["object"] == "file" and f["purpose"] == "fine-tune" and f["filename"] == "train.jsonl"
          and f["bytes"] == os.path.getsize(path) and f["status"] == "processed",
          f"files.create gives OpenAI's file object ({f['bytes']} bytes, openai {out['version']})")
    check(out["file_retrieved"]["id"] == f["id"] and f["id"] in out["files"], "files.retrieve and files.list find it")
    c = out["created"]
    hp = c["hyperparameters"]
    check(c["object"] == "fine_tuning.job" and c["model"] == "lathe-tiny" and c["training_file"] == f["id"]
          and c["status"] in ("validating_files", "queued") and c["seed"] == 7,
          f"fine_tuning.jobs.create answers a fine_tuning.job ({c['status']})")
    check(hp["n_epochs"] == 1 and hp["batch_size"] == 8 and abs(hp["learning_rate_multiplier"] - 15) < 1e-9,
          "the hyperparameters read back as given (n_epochs, batch_size, learning_rate_multiplier)")
    check(c["user_provided_suffix"] == "npm-test" and c["metadata"] == {"team": "ci"}, "suffix and metadata kept")
    doomed = out["cancelled"]["id"]
    check(out["listed"][:2] == [doomed, c["id"]], f"jobs.list is newest first ({out['listed'][:2]})")
    fin = out["final"]
    check(fin["status"] == "succeeded" and fin["fine_tuned_model"] == f"ft:lathe-tiny:{c['id']}"
          and fin["finished_at"] >= fin["created_at"] and fin["error"] is None,
          f"the job succeeded as {fin['fine_tuned_model']} ({fin['status']}: {fin['error']})")
    check(out["cancelled"]["status"] == "cancelled", "jobs.cancel ends the second job cancelled")
    ev = out["events"]
    ids = [e["id"] for e in ev]
    check(len(ev) > 5 and len(set(ids)) == len(ids), f"listEvents pages through {len(ev)} events, none twice")
    times = [e["created_at"] for e in ev]
    check(times == sorted(times, reverse=True) and ev[-1]["message"] == "Created fine-tuning job",
          "events are newest first, the creation last")
    steps = [e for e in ev if e["type"] == "metrics" and "train_loss" in e["data"]]
    check(steps and all(e["object"] == "fine_tuning.job.event" and e["level"] == "info" for e in steps),
          f"step events carry train_loss ({len(steps)} of them)")
    cks = out["checkpoints"]
    nums = [k["step_number"] for k in cks]
    check(cks and nums == sorted(nums, reverse=True) and cks[0]["fine_tuned_model_checkpoint"] == fin["fine_tuned_model"]
          and all(k["fine_tuning_job_id"] == c["id"] for k in cks),
          f"checkpoints.list is newest first, the final one named as the model (steps {nums})")
    check(all(isinstance(k["metrics"].get("train_loss"), (int, float)) for k in cks),
          "each checkpoint carries the training loss of its step")
    check("lathe-tiny" in out["models"] and fin["fine_tuned_model"] in out["models"],
          "models.list names the base model and the fine-tuned one")
    e = out["errors"]
    want = {"model": (400, "invalid_request_error", "model"), "file": (404, "not_found_error", "training_file"),
            "hp": (400, "invalid_request_error", "hyperparameters.n_epochs"),
            "unknown": (404, "not_found_error", None), "purpose": (400, "invalid_request_error", "purpose"),
            "bad_file": (400, "invalid_request_error", None), "long_name": (400, "invalid_request_error", "file"),
            "multiplier": (400, "invalid_request_error", "hyperparameters.learning_rate_multiplier")}
    for name, (status, typ, param) in want.items():
        got = e[name]
        check(got and got["status"] == status and got["type"] == typ and got["param"] == param,
              f"a bad {name} raises APIError {status} {typ} param={param} ({(got or {}).get('message', '')[:70]})")


def isolation(base, key_a, key_b, out):
    job, file = out["created"]["id"], out["file"]["id"]
    for method, path in (("GET", f"/v1/fine_tuning/jobs/{job}"), ("POST", f"/v1/fine_tuning/jobs/{job}/cancel"),
                         ("GET", f"/v1/fine_tuning/jobs/{job}/events"), ("GET", f"/v1/fine_tuning/jobs/{job}/checkpoints"),
                         ("GET", f"/v1/files/{file}"), ("DELETE", f"/v1/files/{file}")):
        st, body = http_json(base, key_b, method, path)
        check(st == 404 and body["error"]["type"] == "not_found_error", f"tenant B: {method} {path.split('/')[2]}/A's → 404")
    st, body = http_json(base, key_b, "GET", "/v1/fine_tuning/jobs")
    check(st == 200 and job not in [j["id"] for j in body["data"]], "tenant B's job list does not hold A's job")
    st, body = http_json(base, key_b, "GET", "/v1/files")
    check(st == 200 and file not in [f["id"] for f in body["data"]], "tenant B's file list does not hold A's file")
    st, body = http_json(base, key_a, "GET", f"/v1/jobs/{job}")
    check(st == 200 and body["state"] == "completed" and body["spec"].get("metadata") == {"team": "ci"}
          and body["spec"].get("suffix") == "npm-test", "the native API shows the same job, its metadata recorded")
    st, body = http_json(base, key_a, "GET", "/v1/jobs?limit=1")
    check(st == 200 and body["jobs"][0]["id"] == out["cancelled"]["id"] and body["has_more"],
          "the native job list is newest first too")


def checkpoint_models(base, sampler, key_a, key_b, out, d):
    """The checkpoints the listing names are models: each one retention keeps samples, one it let
    go is 404 saying so, and tenant B gets the same 404 for A's as for a step that never was."""
    # a job of its own on the native route: a checkpoint every 5 steps
    st, j = http_json(base, key_a, "POST", "/v1/jobs",
                      {"base_model": "lathe-tiny", "dataset_id": out["file"]["id"],
                       "hyperparameters": {"epochs": 1, "checkpoint_interval": 5}})
    check(st in (200, 201, 202), f"a job checkpointing every 5 steps is submitted ({st}: {str(j)[:200]})")
    job = j["id"]
    deadline = time.time() + 600
    while time.time() < deadline and j.get("state") not in ("completed", "failed", "cancelled"):
        time.sleep(1)
        st, j = http_json(base, key_a, "GET", f"/v1/jobs/{job}")
    check(j.get("state") == "completed", f"it completes ({j.get('state')})")
    st, page = http_json(base, key_a, "GET", f"/v1/fine_tuning/jobs/{job}/checkpoints?limit=100")
    cks = page.get("data") or []
    nums = [k["step_number"] for k in cks]
    print(f"openai_ft: checkpoints at steps {nums}", file=sys.stderr, flush=True)
    check(len(cks) >= 4, f"the job committed enough checkpoints for retention to let one go ({nums})")
    # the publisher prunes once it published: the older checkpoints' objects are gone then
    d.wait_for(rf"job {job}: retention: deleted \d+ staging objects", 120)
    prompt = {"prompt": "Q: what is 2 + 3?\nA:", "max_tokens": 6, "temperature": 0}
    for k in cks[:3]:  # the newest and the two before it (keep_checkpoints, 2 by default)
        name = k["fine_tuned_model_checkpoint"]
        st, body = http_json(sampler, key_a, "POST", "/v1/completions", dict(prompt, model=name))
        check(st == 200 and body.get("model") == name, f"checkpoint {name} samples ({st}: {str(body)[:160]})")
    inter = cks[1]["fine_tuned_model_checkpoint"]
    check(cks[0]["fine_tuned_model_checkpoint"] == f"ft:lathe-tiny:{job}" and inter.endswith(f":ckpt-step-{nums[1]}"),
          f"an intermediate checkpoint has a name of its own ({inter})")
    gone = cks[-1]["fine_tuned_model_checkpoint"]
    st, body = http_json(sampler, key_a, "POST", "/v1/completions", dict(prompt, model=gone))
    check(st == 404 and body["error"]["param"] == "model" and "no longer kept" in body["error"]["message"],
          f"the oldest checkpoint, pruned, is 404 saying so ({st}: {str(body)[:200]})")
    never = f"ft:lathe-tiny:{job}:ckpt-step-{max(nums) + 1000}"
    for who, key, name in (("tenant A", key_a, never), ("tenant A", key_a, inter.replace("ckpt-step-", "ckpt-step-0")),
                           ("tenant B", key_b, inter), ("tenant B", key_b, never)):
        st, body = http_json(sampler, key, "POST", "/v1/completions", dict(prompt, model=name))
        check(st == 404 and body["error"]["code"] == "model_not_found" and "no longer kept" not in body["error"]["message"],
              f"{who}: {name.split(':')[-1]} of A's job is 404 model_not_found ({st})")


def hub_id(base, key, out):
    """A base named as the Hub names models (ORG/NAME: a directory one level down) trains and is
    listed; a path in its place is refused naming the field."""
    st, m = http_json(base, key, "GET", "/v1/models")
    check(st == 200 and "hf-lathe/tiny" in [x["id"] for x in m["data"]], "/v1/models lists the base hf-lathe/tiny")
    st, j = http_json(base, key, "POST", "/v1/fine_tuning/jobs",
                      {"model": "hf-lathe/tiny", "training_file": out["file"]["id"], "hyperparameters": {"n_epochs": 1}})
    check(st == 200 and j["model"] == "hf-lathe/tiny", f"a job on the Hub-named base hf-lathe/tiny is created ({st})")
    deadline = time.time() + 600
    while time.time() < deadline and j.get("status") not in ("succeeded", "failed", "cancelled"):
        time.sleep(1)
        st, j = http_json(base, key, "GET", f"/v1/fine_tuning/jobs/{j['id']}")
    check(j.get("status") == "succeeded" and j["fine_tuned_model"] == f"ft:hf-lathe/tiny:{j['id']}",
          f"it trains and is published as {j.get('fine_tuned_model')} ({j.get('status')}: {j.get('error')})")
    for model in ("../lathe-tiny", "hf-lathe/tiny/x", "/etc"):
        st, e = http_json(base, key, "POST", "/v1/fine_tuning/jobs", {"model": model, "training_file": out["file"]["id"]})
        check(st == 400 and e["error"]["param"] == "model", f"model {model!r} is refused naming model")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: openai_ft_python.py PATH/TO/lathe PATH/TO/lathed")
    lathe, lathed = sys.argv[1], sys.argv[2]
    admin = admin_client(fail)
    run_id = f"{os.getpid()}{secrets.token_hex(3)}"
    prefix = f"toft{run_id}."
    env = dict(os.environ, LATHE_KAFKA_BOOTSTRAP=BOOTSTRAP, LATHE_TOPIC_PREFIX=prefix, LATHE_SOURCE_ROOT=ROOT)
    tmp = tempfile.mkdtemp(prefix="lathe-openai-ft-")
    cache = lt_test.tiny_model(lathe, env)
    # Its own models directory: the bundle, and the same model as a Hub-named base (ORG/NAME).
    models = os.path.join(tmp, "models")
    os.makedirs(os.path.join(models, "hf-lathe"))
    os.symlink(os.path.join(cache, "lathe-tiny"), os.path.join(models, "lathe-tiny"))
    os.symlink(os.path.join(cache, "lathe-tiny"), os.path.join(models, "hf-lathe", "tiny"))
    env["LATHE_MODELS_DIR"] = models
    d = None
    try:
        run([lathe, "admin", "topics"], env, "lathe admin topics")
        keys = []
        for t in ("a", "b"):
            keys.append(json.loads(run([lathe, "admin", "tenant", "create", f"oft{t}{run_id}", "--json"], env,
                                       "tenant create"))["api_key"])
        d = Child("lathed", [lathed, "--role", "all", "--port", "0", "--operator-port", "0", "--sampler-port", "0"],
                  dict(env, LATHE_INSTANCE=f"oft{run_id}", LATHE_API_KEY_RATE="off", LATHE_API_TENANT_RATE="off",
                       LATHE_WORKER_SLOTS="2"))
        port = int(d.wait_for(r"api listening on http://127\.0\.0\.1:(\d+)", 120).group(1))
        ops = int(d.wait_for(r"api operator endpoints \(\S+, \S+\) at http://127\.0\.0\.1:(\d+)", 120).group(1))
        d.wait_for(r"scheduler: leading \(", 90)
        d.wait_for(r"worker \S+ started", 90)
        base = f"http://127.0.0.1:{port}"
        sport = int(d.wait_for(r"sampler listening on http://127\.0\.0\.1:(\d+)", 120).group(1))
        sampler = f"http://127.0.0.1:{sport}"
        # The api answers 503 "starting" until it has read the log back (slow under the sanitizers).
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ops}/healthz", timeout=5) as r:
                    if r.status == 200:
                        break
            except (OSError, urllib.error.HTTPError):
                pass
            time.sleep(0.2)
        else:
            fail("the api did not become ready (/healthz 200) within 120 s")
        try:
            path = lt_test.task_file(env["LATHE_MODELS_DIR"], os.path.join(tmp, "train.jsonl"))
            out = run_npm(base, keys[0], path)
            check_npm(out, path)
            isolation(base, keys[0], keys[1], out)
            checkpoint_models(base, sampler, keys[0], keys[1], out, d)
            hub_id(base, keys[0], out)
        except BaseException:
            d.dump()
            raise
    finally:
        if d:
            d.stop()
        lt_test.delete_topics(admin, prefix)
        shutil.rmtree(tmp, ignore_errors=True)
    T.summary()


if __name__ == "__main__":
    main()
