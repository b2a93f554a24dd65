#!/usr/bin/python3
"""The systemd units of ops/systemd: one per role, each starting that role, and every one clean
under `systemd-analyze verify` (no error, no warning) with ExecStart pointing at the lathed this
build made.

usage: systemd_check.py SOURCE_ROOT PATH/TO/lathed"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROLES = ("api", "scheduler", "worker", "publisher", "sampler")


def fail(msg):
    raise SystemExit(f"systemd_check: FAIL: {msg}")


def main():
    root, lathed = sys.argv[1], os.path.abspath(sys.argv[2])
    if not shutil.which("systemd-analyze"):
        fail("systemd-analyze is not installed (ops/setup installs the systemd package)")
    units = os.path.join(root, "ops", "systemd")
    tmp = tempfile.mkdtemp(prefix="lathe-units-")
    try:
        paths = []
        for role in ROLES:
            src = os.path.join(units, f"lathed-{role}.service")
            if not os.path.exists(src):
                fail(f"no unit for the {role} role ({src})")
            text = open(src).read()
            start = re.search(r"^ExecStart=(.*)$", text, re.M)
            if not start or not re.search(rf"(^|\s)/usr/local/bin/lathed --role {role}(\s|$)", start.group(1)):
                fail(f"lathed-{role}.service does not start `/usr/local/bin/lathed --role {role}`")
            if "EnvironmentFile=/etc/lathe/lathe.env" not in text:
                fail(f"lathed-{role}.service does not read /etc/lathe/lathe.env")
            dst = os.path.join(tmp, f"lathed-{role}.service")
            with open(dst, "w") as f:
                f.write(text.replace("/usr/local/bin/lathed", lathed))
            paths.append(dst)
            print(f"systemd_check: ok: lathed-{role}.service starts the {role} role")
        p = subprocess.run(["systemd-analyze", "verify", *paths], capture_output=True, text=True, timeout=120)
        out = (p.stdout + p.stderr).strip()
        if p.returncode != 0 or out:
            fail(f"systemd-analyze verify exited {p.returncode}:\n{out}")
        print(f"systemd_check: ok: systemd-analyze verify passes on all {len(paths)} units, nothing printed")
        example = os.path.join(units, "lathe.env.example")
        keys = [l.split("=", 1)[0] for l in open(example) if re.match(r"^[A-Z0-9_]+=", l)]
        bad = [k for k in keys if not k.startswith("LATHE_")]
        if not keys or bad:
            fail(f"lathe.env.example: every setting is a LATHE_ variable ({bad or 'none found'})")
        print(f"systemd_check: ok: lathe.env.example sets {len(keys)} LATHE_ variables")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
