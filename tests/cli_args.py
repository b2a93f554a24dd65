#!/usr/bin/python3
"""cli_args: what `lathe` does with arguments a person gets wrong, and JSON a program reads.

- Every command and subcommand, found by walking `lathe --help` and each command's usage (not a
  list kept here), answers --help with exit 0 and usage on stdout, and an unknown option with
  exit 2, the option named and usage on stderr: one argument parser (src/cli/lt_cli_args.c).
- --url takes http:// and https://; --ca-file without a value, or naming no file, says so.
- Only shared options and no command (`lathe jobs --json`, `lathe datasets -q`) is a usage
  error (exit 2, usage on stderr), not a crash; --help is exit 0 with usage on stdout; an
  option without its value names the option.
- A 503 `starting` (an API still reading its log) is sent again after its Retry-After, a POST
  too; any other 503 is the answer (a stand-in server on loopback).
- `lathe admin tenant create --json` prints JSON that parses whatever the display name holds
  (quotes, backslashes), on the real broker under a scratch topic prefix.

usage: cli_args.py PATH/TO/lathe      Prints one line per check; exit 1 if any failed."""
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lathe = sys.argv[1]
failed = 0


def check(what, ok, detail=""):
    global failed
    print(("ok: " if ok else "FAIL: ") + what + ("" if ok else f" ({detail})"))
    failed += 0 if ok else 1


def run(*args, env=None):
    return subprocess.run([lathe, *args], capture_output=True, text=True, timeout=60, env=env)


def commands():
    """Every command path: those `lathe --help` lists, then each word that follows a path in the
    lines of its usage ("lathe jobs submit ...", "lathe sessions show|end|cancel ID") until the
    next word is an argument (ID, FILE, [OPTIONS], --flag)."""
    top = run("--help")
    todo = [[c] for c in re.findall(r"^  ([a-z]+) ", top.stdout, re.M)]
    seen = []
    while todo:
        path = todo.pop(0)
        seen.append(path)
        prefix = "lathe " + " ".join(path) + " "
        for line in run(*path, "--help").stdout.splitlines():
            line = re.sub(r"^\s*(usage:)?\s*", "", line)
            words = line[len(prefix):].split() if line.startswith(prefix) else []
            for w in words[0].split("|") if words else []:
                if re.fullmatch(r"[a-z][a-z-]*", w) and path + [w] not in seen + todo:
                    todo.append(path + [w])
    return seen


paths = commands()
check("the walk finds the commands and their subcommands",
      len(paths) > 40 and ["jobs", "download"] in paths and ["admin", "tenant", "create"] in paths, paths)
for path in paths:
    name = " ".join(path)
    for h in ("--help", "-h"):
        p = run(*path, h)
        check(f"lathe {name} {h} exits 0 with usage on stdout",
              p.returncode == 0 and "usage:" in p.stdout and not p.stderr, f"exit {p.returncode}, {p.stderr[:200]!r}")
    p = run(*path, "--no-such-option")
    check(f"lathe {name} --no-such-option exits 2 naming it, usage on stderr",
          p.returncode == 2 and '"--no-such-option"' in p.stderr and "usage:" in p.stderr and not p.stdout,
          f"exit {p.returncode}, {p.stderr[:200]!r}")
p = run("jobs", "submit", "--model")
check("an option without its value is named", p.returncode == 2 and "--model needs a value" in p.stderr, p.stderr)
p = run("jobs", "show")
check("a missing operand is a usage error", p.returncode == 2 and "missing" in p.stderr, p.stderr)
p = run("jobs", "show", "a", "b")
check("an extra operand is named", p.returncode == 2 and '"b"' in p.stderr, p.stderr)
p = run("jobs", "submit", "--json=1")
check("a flag given a value says it takes none", p.returncode == 2 and "--json takes no value" in p.stderr, p.stderr)

for cmd in ("jobs", "datasets", "sessions"):
    for opts in (["--json"], ["-q"], ["--json", "--quiet"], []):
        p = run(cmd, *opts)
        check(f"lathe {cmd} {' '.join(opts)} with no command exits 2 with usage",
              p.returncode == 2 and "usage:" in p.stderr, f"exit {p.returncode}, stderr {p.stderr[:200]!r}")
    p = run(cmd, "--help")
    check(f"lathe {cmd} --help exits 0 with usage on stdout", p.returncode == 0 and "usage:" in p.stdout,
          f"exit {p.returncode}")
    p = run(cmd, "list", "--url")
    check(f"lathe {cmd} list --url names the option that needs a value",
          p.returncode == 2 and "--url needs a value" in p.stderr, f"exit {p.returncode}, {p.stderr!r}")
    p = run(cmd, "list", "--ca-file")
    check(f"lathe {cmd} list --ca-file names the option that needs a value",
          p.returncode == 2 and "--ca-file needs a value" in p.stderr, f"exit {p.returncode}, {p.stderr!r}")
    p = run(cmd, "list", "--url", "https://127.0.0.1:1", "--ca-file", "/nonexistent/ca.pem")
    check(f"lathe {cmd} list with a CA file that is not there says which",
          p.returncode == 2 and "/nonexistent/ca.pem" in p.stderr, f"exit {p.returncode}, {p.stderr!r}")
    p = run(cmd, "list", "--url", "ftp://127.0.0.1:1")
    check(f"lathe {cmd} list with an ftp:// URL names the schemes it takes",
          p.returncode == 2 and "https://HOST" in p.stderr, f"exit {p.returncode}, {p.stderr!r}")



class Starting(BaseHTTPRequestHandler):
    """A stand-in for an API still reading its log: answers `script` in turn, then 200."""
    script, seen = [], []

    def answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Starting.seen.append(f"{self.command} {self.path}")
        status, code = Starting.script.pop(0) if Starting.script else (200, None)
        body = json.dumps({"error": {"code": code, "message": "not yet"}} if code else
                          {"id": "ftjob-x", "state": "cancelled", "cancel_requested": True, "model": "m"}).encode()
        self.send_response(status)
        if code:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = answer

    def log_message(self, *a):
        pass


srv = ThreadingHTTPServer(("127.0.0.1", 0), Starting)
threading.Thread(target=srv.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{srv.server_address[1]}"
Starting.script, Starting.seen = [(503, "starting"), (503, "starting")], []
p = run("jobs", "cancel", "ftjob-x", "--url", url, "--json")
check("a 503 `starting` is sent again after its Retry-After, a POST too, until it is answered",
      p.returncode == 0 and Starting.seen == ["POST /v1/jobs/ftjob-x/cancel"] * 3, f"{Starting.seen} {p.stderr!r}")
Starting.script, Starting.seen = [(503, "unavailable")], []
p = run("jobs", "show", "ftjob-x", "--url", url)
check("any other 503 is the answer: said once, not sent again",
      p.returncode == 1 and len(Starting.seen) == 1 and "HTTP 503 unavailable" in p.stderr, f"{Starting.seen} {p.stderr!r}")
srv.shutdown()

# Numbers a person gets wrong are refused naming the option, not cut at the first bad character or
# wrapped to another number; a file is not left cut short where a whole one was.
scratch = tempfile.mkdtemp(prefix="cli_args.")
trace = os.path.join(scratch, "t.csv")
p = run("sim", "gen", "--jobs", "40", "--out", trace)
check("sim gen writes a trace", p.returncode == 0 and open(trace).read().startswith("arrival_s,"), p.stderr)
for args, opt in ((["sim", trace, "--workers", "1.5"], "--workers"),
                  (["sim", trace, "--workers", "4294967297"], "--workers"),
                  (["sim", trace, "--models-per-worker", "4294967296"], "--models-per-worker"),
                  (["sim", trace, "--tenant", "a:1:0.5"], "max running slots"),
                  (["sim", trace, "--tenant", "a:1:2:3:extra"], "--tenant"),
                  (["sim", trace, "--tick", "1e-9"], "--tick"),
                  (["sim", "gen", "--jobs", "1e30"], "--jobs"),
                  (["sim", "gen", "--days", "1e305"], "--days"),
                  (["sim", "gen", "--seed", "1e25"], "--seed"),
                  (["sim", "gen", "--seed", "9007199254740993"], "--seed"),
                  (["sim", "gen", "--jobs", "1", "--slots", "1", "--load", "1", "--seed", "10"], "--load"),
                  (["model", "make", "--steps", "600abc", "--out", os.path.join(scratch, "m")], "--steps"),
                  (["model", "make", "--threads", "4x", "--out", os.path.join(scratch, "m")], "--threads")):
    p = run(*args)
    check(f"`lathe {' '.join(args[:2])} ... {' '.join(args[2:])[-40:]}` is exit 2 naming {opt}",
          p.returncode == 2 and opt in p.stderr and not os.path.exists(os.path.join(scratch, "m")),
          f"exit {p.returncode}: {p.stderr[-200:]!r}")
for args, kv in ((["train", "--model", "m", "--train", "t.jsonl"], b"bo\xffgus=1"),
                 (["jobs", "submit", "--model", "m", "--dataset", "d"], b"bo\xffgus=1"),
                 (["jobs", "submit", "--model", "m", "--dataset", "d"], b"target_modules=q_proj,\xff")):
    p = run(*args, b"--set", kv)
    check(f"lathe {args[0]} --set {kv[:14]!r} (not UTF-8) is exit 2 saying so (it was dropped silently)",
          p.returncode == 2 and "must be UTF-8" in p.stderr, f"exit {p.returncode}: {p.stderr[-200:]!r}")
stuck = os.path.join(scratch, "stuck.csv")
with open(stuck, "w") as f:
    f.write("arrival_s,tenant,class,gpus,duration_s,base_model\n0,a,standard,16,100,m\n")
try:
    p = subprocess.run([lathe, "sim", stuck, "--workers", "2", "--tick", "3600"], capture_output=True, text=True,
                       timeout=30)
    stuck_ok, detail = "deadlock" in p.stderr, p.stderr[-200:]
except subprocess.TimeoutExpired:
    stuck_ok, detail = False, "still running after 30 s"
check("sim --tick on a job the policy never starts reports the deadlock (it ran forever)", stuck_ok, detail)
os.unlink(stuck)
link = os.path.join(scratch, "link.csv")
os.symlink("elsewhere.csv", link)
p = run("sim", "gen", "--jobs", "5", "--out", link)
check("sim gen --out a symlink writes through it, the link kept",
      p.returncode == 0 and os.path.islink(link) and open(link).read().startswith("arrival_s,"), p.stderr[-200:])
os.unlink(link)
os.unlink(os.path.join(scratch, "elsewhere.csv"))
before = open(trace).read()


def small_files():
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


p = subprocess.run([lathe, "sim", "gen", "--jobs", "1000", "--seed", "2", "--out", trace], capture_output=True,
                   text=True, timeout=60, preexec_fn=small_files)
check("sim gen that cannot finish its file fails saying why and leaves the old file whole, and no other",
      p.returncode == 1 and "File too large" in p.stderr and open(trace).read() == before
      and os.listdir(scratch) == ["t.csv"], f"exit {p.returncode}: {p.stderr[-200:]!r} {os.listdir(scratch)}")
p = run("admin", "tenant", "list", env=dict(os.environ, LATHE_KAFKA_CONFIG_DIR=os.path.join(scratch, "none")))
check("admin tenant list without the bus's credentials fails saying so (it crashed)",
      p.returncode == 1 and "no Kafka credentials" in p.stderr, f"exit {p.returncode}: {p.stderr[-200:]!r}")
shutil.rmtree(scratch, ignore_errors=True)

if not os.environ.get("LATHE_KAFKA_BOOTSTRAP"):
    check("the stack's environment is set (ops/test sets it)", False, "LATHE_KAFKA_BOOTSTRAP unset")
else:
    env = dict(os.environ, LATHE_TOPIC_PREFIX=f"cliargs{os.getpid()}{random.randrange(1 << 30)}.")
    p = run("admin", "topics", env=env)
    check("scratch topics created", p.returncode == 0, p.stderr)
    name = 'Acme "Quoted" \\ Corp'
    p = run("admin", "tenant", "create", "acme", "--name", name, "--weight", "2", "--json", env=env)
    try:
        t = json.loads(p.stdout)
    except ValueError as e:
        t = None
        check("tenant create --json prints JSON with a quoted display name", False, f"{e}: {p.stdout!r}")
    if t is not None:
        check("tenant create --json keeps the display name and weight",
              t.get("name") == name and t.get("weight") == 2 and t.get("api_key", "").startswith("lt_"), t)

print(f"cli_args: {failed} failed")
sys.exit(1 if failed else 0)
