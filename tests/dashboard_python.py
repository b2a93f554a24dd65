#!/usr/bin/python3
"""The web dashboard on the real stack, in Debian's headless Chromium (tests/dashboard.mjs).

Against `lathed --role all` (with the scheduler's operator port): the page refuses a wrong key,
signs in with a tenant's, starts a fine-tune (upload + submit), draws the loss curve and keeps
drawing it as steps arrive, shows the completed job's evaluation and artifacts; the scheduler's
operator port shows queues, shares, Jain's index and the fleet. The files are served with a
Content-Security-Policy that allows nothing but their own origin; paths outside the dashboard's
files answer 404. Screenshots are kept under the build directory (tests/dashboard-shots/).

usage: dashboard_python.py PATH/TO/lathe PATH/TO/lathed
Environment: the stack's (`ops/stack env`), LATHE_E2E_CACHE."""
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import lt_test
from lt_test import BOOTSTRAP, ROOT, Child, admin_client, run

T = lt_test.Checks("dashboard")
check, fail = T.check, T.fail


def get(url, method="GET"):
    req = urllib.request.Request(url, method=method)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def serving(base):
    st, h, body = get(base + "/dashboard/")
    check(st == 200 and b'<script src="app.js"' in body and "default-src 'self'" in h.get("Content-Security-Policy", "")
          and "frame-ancestors 'none'" in h["Content-Security-Policy"] and h.get("X-Content-Type-Options") == "nosniff",
          "GET /dashboard/ serves the page with a same-origin Content-Security-Policy")
    st, h, _ = get(base + "/dashboard")
    check(st == 301 and h.get("Location") == "/dashboard/", "/dashboard redirects to /dashboard/")
    st, h, _ = get(base + "/dashboard/app.js")
    check(st == 200 and h.get("Content-Type", "").startswith("text/javascript"), "app.js is served as JavaScript")
    for path in ("/dashboard/nope.js", "/dashboard/..%2f..%2fetc%2fpasswd", "/dashboard/sub/index.html"):
        st, _, _ = get(base + path)
        check(st == 404, f"{path} answers 404")
    st, _, _ = get(base + "/dashboard/", "POST")
    check(st == 405, "POST /dashboard/ answers 405")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: dashboard_python.py PATH/TO/lathe PATH/TO/lathed")
    lathe, lathed = sys.argv[1], sys.argv[2]
    for need, how in (("/usr/bin/chromium", "ops/setup installs Debian's chromium"),
                      (os.path.join(ROOT, "tests", "browser", "node_modules", "puppeteer-core"), "run ops/setup")):
        if not os.path.exists(need):
            fail(f"{need} is missing: {how}")
    admin = admin_client(fail)
    run_id = f"{os.getpid()}{secrets.token_hex(3)}"
    prefix = f"tdash{run_id}."
    env = dict(os.environ, LATHE_KAFKA_BOOTSTRAP=BOOTSTRAP, LATHE_TOPIC_PREFIX=prefix, LATHE_SOURCE_ROOT=ROOT)
    tmp = tempfile.mkdtemp(prefix="lathe-dashboard-")
    shots = os.path.join(os.getcwd(), "tests", "dashboard-shots")
    os.makedirs(shots, exist_ok=True)
    cache = env["LATHE_MODELS_DIR"] = lt_test.tiny_model(lathe, env)
    d = None
    try:
        run([lathe, "admin", "topics"], env, "lathe admin topics")
        tenant = f"dash{run_id}"
        key = json.loads(run([lathe, "admin", "tenant", "create", tenant, "--json"], env, "tenant create"))["api_key"]
        d = Child("lathed", [lathed, "--role", "all", "--port", "0", "--operator-port", "0", "--scheduler-port", "0"],
                  dict(env, LATHE_INSTANCE=f"dash{run_id}", LATHE_API_KEY_RATE="off", LATHE_API_TENANT_RATE="off",
                       LATHE_WORKER_SLOTS="2"))
        port = int(d.wait_for(r"api listening on http://127\.0\.0\.1:(\d+)", 120).group(1))
        sport = int(d.wait_for(r"scheduler operator endpoints .* at http://127\.0\.0\.1:(\d+)", 120).group(1))
        d.wait_for(r"scheduler: leading \(", 90)
        base, sbase = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{sport}"
        train = lt_test.task_file(cache, os.path.join(tmp, "train.jsonl"))
        try:
            serving(base)
            p = subprocess.run(["node", os.path.join(ROOT, "tests", "dashboard.mjs"), base, sbase, key, train, shots],
                               capture_output=True, text=True, timeout=1200)
            if p.returncode != 0:
                fail(f"the browser run failed: {p.stderr.strip()[-1500:]}")
            out = json.loads(p.stdout.strip().splitlines()[-1])
            check("not valid" in out["bad_key_error"], f"a wrong key is refused on the page ({out['bad_key_error'][:60]})")
            check(out["signed_in"] and out["job"].startswith("job-"), f"signed in, a fine-tune started from the page ({out['job']})")
            check(out["points_first"] >= 2 and out["points_later"] > out["points_first"],
                  f"the loss curve is drawn and grows live ({out['points_first']} then {out['points_later']} points)")
            check(out["curve_pixels"] > 50, f"the curve is on the canvas ({out['curve_pixels']} curve pixels)")
            check(out["state"] == "completed" and out["points_final"] >= out["points_later"],
                  f"the job completed on the page ({out['points_final']} points)")
            check(len(out["eval_rows"]) > 0, f"the evaluation table is shown ({out['eval_rows'][:2]})")
            check(any(a.startswith("adapter_model.safetensors") for a in out["artifacts"]),
                  f"the artifacts are listed ({len(out['artifacts'])})")
            check(out["jobs_listed"][:1] == [out["job"]], "the job list shows it first")
            check(out["page_errors"] == [], f"no script error on the page ({out['page_errors'][:2]})")
            check(any(r[0] == tenant for r in out["operator_rows"]), "the operator view lists the tenant's queue and share")
            check(sorted(r[0] for r in out["operator_jain"]) == ["preemptible", "production", "standard"],
                  "the operator view shows Jain's index per class")
            check(any(r[0] == "workers" for r in out["operator_fleet"]), "the operator view shows the fleet")
            check(len(out["operator_workers"]) == 1 and out["operator_workers"][0][2] == "yes"
                  and float(out["operator_workers"][0][4]) < 30,
                  f"the operator view shows the worker up, its heartbeat recent ({out['operator_workers']})")
            for name in ("dashboard-training.png", "dashboard-completed.png", "dashboard-operator.png"):
                with open(os.path.join(shots, name), "rb") as f:
                    check(f.read(8) == b"\x89PNG\r\n\x1a\n", f"screenshot {name} kept under {shots}")
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
