#!/usr/bin/python3
"""bench_limits: how many of a burst of bad-key requests `lathed api` throttles.

Starts `lathed --role api` on a scratch topic prefix and sends N requests with a wrong API key
from one address as fast as one keep-alive connection allows, counting the answers (401: the key
was checked; 429: the address was throttled before its key was looked at). The peer in the same
run is the same burst against an API with the limit off (LATHE_API_AUTH_FAIL_RATE=off): every
guess is checked there.

    bench/bench_limits.py PATH/TO/lathe PATH/TO/lathed [N=300]   (needs eval "$(ops/stack env)")

Last line: `bad_key_burst_429: K/N`."""
import http.client
import os
import random
import re
import subprocess
import sys
import time


def start(lathed, env, log):
    p = subprocess.Popen([lathed, "--role", "api", "--port", "0", "--operator-port", "0"], env=env,
                         stdout=log, stderr=subprocess.STDOUT)
    for _ in range(300):
        text = open(log.name).read()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
        if m:
            return p, int(m.group(1))
        if p.poll() is not None:
            sys.exit("bench_limits: lathed exited: " + text[-2000:])
        time.sleep(0.1)
    p.kill()
    sys.exit("bench_limits: lathed printed no port")


def burst(port, n):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    counts = {}
    t0 = time.monotonic()
    for _ in range(n):
        conn.request("GET", "/v1/jobs", headers={"Authorization": "Bearer lt_0123456789abcdef_notakey"})
        r = conn.getresponse()
        r.read()
        counts[r.status] = counts.get(r.status, 0) + 1
    return counts, time.monotonic() - t0


def main():
    lathe, lathed = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    if not os.environ.get("LATHE_KAFKA_BOOTSTRAP"):
        sys.exit('bench_limits: needs the local stack: eval "$(ops/stack env)"')
    env = dict(os.environ, LATHE_TOPIC_PREFIX="blim%08x." % random.getrandbits(32),
               LATHE_MASTER_KEY="00" * 32)
    env.pop("LATHE_MASTER_KEY_FILE", None)
    subprocess.run([lathe, "admin", "topics"], env=env, check=True, capture_output=True)
    results = {}
    for name, rate in (("limited (default 2/s, burst 30)", None), ("peer: limit off", "off")):
        e = dict(env)
        if rate:
            e["LATHE_API_AUTH_FAIL_RATE"] = rate
        else:
            e.pop("LATHE_API_AUTH_FAIL_RATE", None)
        log = open("/tmp/bench_limits.%d.log" % os.getpid(), "w")
        p, port = start(lathed, e, log)
        try:
            counts, secs = burst(port, n)
        finally:
            p.terminate()
            p.wait(10)
        results[name] = counts
        print("%-32s %d requests in %.3f s: %s" % (name, n, secs,
              ", ".join("%d x %d" % (v, k) for k, v in sorted(counts.items()))))
    limited = results["limited (default 2/s, burst 30)"]
    print("bad_key_burst_429: %d/%d" % (limited.get(429, 0), n))


if __name__ == "__main__":
    main()
