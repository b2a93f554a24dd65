"""`lathe sim --json` prints one JSON object that scripts can read, with the same figures as the
table: on the heavy-tenant trace Lathe's policy is fairer than FIFO (Jain's index per class).

usage: sim_json.py PATH/TO/lathe   (LATHE_SOURCE_ROOT: the repository)"""
import json
import os
import subprocess
import sys

lathe = sys.argv[1]
root = os.environ.get("LATHE_SOURCE_ROOT", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
trace = os.path.join(root, "bench", "traces", "heavy.csv")
out = subprocess.run([lathe, "sim", trace, "--workers", "4", "--slots", "4", "--json"], capture_output=True, text=True)
if out.returncode != 0:
    sys.exit(f"sim_json: lathe sim failed ({out.returncode}): {out.stderr}")
d = json.loads(out.stdout)
pol = {p["policy"]: p for p in d["policies"]}
if set(pol) != {"lathe", "fifo"}:
    sys.exit(f"sim_json: policies {sorted(pol)}, wanted lathe and fifo")
if d["jobs"] <= 0 or not pol["lathe"]["rows"]:
    sys.exit("sim_json: no jobs or no rows")
for p in pol.values():
    for row in p["rows"]:
        for k in ("tenant", "class", "weight", "jobs", "wait_p50_s", "wait_p99_s", "share", "entitlement"):
            if k not in row:
                sys.exit(f"sim_json: row without {k}: {row}")
jl, jf = pol["lathe"]["jain"]["standard"], pol["fifo"]["jain"]["standard"]
if not jl > jf + 0.1:
    sys.exit(f"sim_json: Jain (standard) lathe {jl} is not above fifo {jf} + 0.1")
bad = subprocess.run([lathe, "sim", trace, "--json", "--policy", "nope"], capture_output=True, text=True)
if bad.returncode != 2 or "--policy" not in bad.stderr:
    sys.exit(f"sim_json: a bad --policy must exit 2 naming it, got {bad.returncode}: {bad.stderr}")
print(f"sim_json: OK (Jain standard: lathe {jl:.3f}, fifo {jf:.3f})")
