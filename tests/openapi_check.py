#!/usr/bin/python3
"""openapi_check: docs/openapi.yaml describes exactly the routes the servers serve, and lints clean.

1. The routes, read from the sources: the customer port's table (routes[] in
   src/control/lt_api.c), the API's operator port (route_operator in the same file) and the
   scheduler's operator port (on_request in src/control/lt_scheduler_ops.c).
2. The document's paths and methods: the two sets must be equal; what either side lacks is
   printed. Operator paths must carry their own `servers` (the operator ports, not the customer
   port) and no authentication; staff paths the staff key; every other path the tenant's key.
3. Redocly CLI (tests/reference/node_modules, installed by ops/setup) lints the document with
   docs/redocly.yaml: no errors and no warnings.

usage: openapi_check.py [SOURCE_ROOT]      Exit 0 when all holds, 1 otherwise.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
DOC = os.path.join(ROOT, "docs", "openapi.yaml")
CONFIG = os.path.join(ROOT, "docs", "redocly.yaml")
REFERENCE = os.path.join(ROOT, "tests", "reference")
REDOCLY = os.path.join(REFERENCE, "node_modules", ".bin", "redocly")
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# evhttp_set_allowed_methods in lt_api.c: what an ANY row of the table answers.
ALLOWED = ("get", "post", "put", "delete")

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def block(text, start_re, what):
    """The text from start_re's match to the end of that brace block (a table or a function)."""
    m = re.search(start_re, text)
    if not m:
        raise SystemExit("openapi_check: cannot find %s in the source: update this test" % what)
    depth, i = 0, text.index("{", m.start())
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j + 1]
    raise SystemExit("openapi_check: %s does not end" % what)


def customer_routes():
    """(method, path) of every row of routes[]; a row this reader does not understand fails."""
    table = block(read("src/control/lt_api.c"), r"static const lt_api_route_t routes\[\]\s*=", "routes[]")
    rows = re.findall(r"^\s*\{[^\n]*\},?\s*$", table, re.M)
    out = set()
    for row in rows:
        m = re.match(r'\s*\{\s*(EVHTTP_REQ_(GET|POST|PUT|DELETE)|ANY)\s*,\s*"([^"]+)"\s*,', row)
        if not m:
            fail("a row of routes[] this test cannot read: %s" % row.strip())
            continue
        methods = ALLOWED if m.group(1) == "ANY" else (m.group(2).lower(),)
        out.update((meth, m.group(3)) for meth in methods)
    if len(rows) < 10:
        fail("routes[] has only %d rows as read: the table's shape changed, update this test" % len(rows))
    return out


def operator_routes(rel, func_re, what):
    """(get, path) for every path a GET-only operator handler compares its path with."""
    body = block(read(rel), func_re, what)
    paths = set(re.findall(r'strcmp\(path,\s*"(/[^"]*)"\)\s*==\s*0', body))
    if not paths:
        fail("%s: no path comparisons found: update this test" % what)
    if "!= EVHTTP_REQ_GET" not in body:
        fail("%s no longer answers GET only: update this test and docs/openapi.yaml" % what)
    return {("get", p) for p in paths}


def load_doc():
    """The document as data: with PyYAML when the system has it, else Redocly's JSON bundle."""
    try:
        import yaml  # Debian's python3-yaml; not always installed
        with open(DOC, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except ImportError:
        pass
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "openapi.json")
        r = subprocess.run([REDOCLY, "bundle", DOC, "--ext", "json", "-o", out], env=redocly_env(),
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise SystemExit("openapi_check: redocly bundle failed:\n" + r.stdout + r.stderr)
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def redocly_env():
    env = dict(os.environ)
    env["REDOCLY_TELEMETRY"] = "off"  # a test sends nothing anywhere
    env["REDOCLY_SUPPRESS_UPDATE_NOTICE"] = "true"
    return env


def server_ports(servers):
    return {str(s.get("variables", {}).get("port", {}).get("default")) for s in servers or []}


def check_doc(doc, served, api_ops, sched_ops):
    documented = set()
    for path, item in doc.get("paths", {}).items():
        for meth in HTTP_METHODS:
            if meth in item:
                documented.add((meth, path))
    for what, missing in (("served but not in docs/openapi.yaml", served - documented),
                          ("in docs/openapi.yaml but not served", documented - served)):
        for meth, path in sorted(missing, key=lambda r: (r[1], r[0])):
            fail("%s: %s %s" % (what, meth.upper(), path))
    operator = {p for _, p in api_ops | sched_ops}
    for path, item in doc.get("paths", {}).items():
        ops = [item[m] for m in HTTP_METHODS if m in item]
        if path in operator:
            ports = server_ports(item.get("servers"))
            # the defaults of --operator-port and of the scheduler's port in the document
            want = ({"8081"} if ("get", path) in api_ops else set()) | ({"8082"} if ("get", path) in sched_ops else set())
            if ports != want:
                fail("%s: its servers should be the operator ports %s, not %s" % (path, sorted(want), sorted(ports)))
            for op in ops:
                if op.get("security") != []:
                    fail("%s: the operator ports take no authentication (security: [])" % path)
        else:
            if "servers" in item:
                fail("%s: a customer route on other servers than the document's" % path)
            for op in ops:
                want = [{"staffKey": []}] if path.startswith("/v1/staff/") else None
                if op.get("security") != want:
                    fail("%s %s: security should be %s" % (op.get("operationId"), path,
                                                          want or "the document's (the tenant's key)"))
    if doc.get("security") != [{"tenantKey": []}]:
        fail("the document's security should be the tenant's key")
    print("openapi_check: %d routes served, %d documented" % (len(served), len(documented)))


def lint():
    if not os.path.isdir(os.path.join(REFERENCE, "node_modules", "@redocly", "cli")) or not os.path.exists(REDOCLY):
        fail("Redocly CLI is not installed in tests/reference/node_modules: run ops/setup")
        return
    r = subprocess.run([REDOCLY, "lint", "--config", CONFIG, "--format=json", DOC], env=redocly_env(),
                       capture_output=True, text=True, timeout=120)
    try:
        report = json.loads(r.stdout)
    except ValueError:
        fail("redocly lint gave no report (exit %d):\n%s%s" % (r.returncode, r.stdout, r.stderr))
        return
    for p in report.get("problems", []):
        where = ", ".join(loc.get("pointer", "") for loc in p.get("location", []))
        print("  %s %s: %s (%s)" % (p.get("severity"), p.get("ruleId"), p.get("message"), where))
    totals = report.get("totals", {})
    if r.returncode != 0 or totals.get("errors") or totals.get("warnings"):
        fail("redocly lint: exit %d, %s errors, %s warnings (fix them, or turn the rule off in docs/redocly.yaml "
             "with a reason)" % (r.returncode, totals.get("errors"), totals.get("warnings")))
    else:
        print("openapi_check: redocly lint %s: no problems" % report.get("version", "?"))


def have_yaml():
    try:
        import yaml  # noqa: F401
        return True
    except ImportError:
        return False


def main():
    served = customer_routes()
    api_ops = operator_routes("src/control/lt_api.c", r"static lt_api_slot_t route_operator\(", "route_operator")
    sched_ops = operator_routes("src/control/lt_scheduler_ops.c", r"static void on_request\(struct evhttp_request",
                                "the scheduler's on_request")
    served |= api_ops | sched_ops
    installed = os.path.exists(REDOCLY)
    # Without Redocly the document is still compared when PyYAML can read it; the test fails anyway.
    if installed or have_yaml():
        check_doc(load_doc(), served, api_ops, sched_ops)
    lint()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
