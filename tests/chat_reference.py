"""chat_reference: test_chat held to @huggingface/jinja's output made now, not the committed copy.

Runs tests/reference/chat_render.mjs on tests/data/chat_templates/cases.json, says whether the
committed expected.json is still what the reference renders, and runs the test_chat binary
(argv[1]) with LATHE_CHAT_EXPECTED pointing at the fresh output. Exits 77 (meson's skip) without
node or tests/reference/node_modules."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

root = os.environ.get("LATHE_SOURCE_ROOT", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ref = os.path.join(root, "tests", "reference")
data = os.path.join(root, "tests", "data", "chat_templates")
if not shutil.which("node") or not os.path.isdir(os.path.join(ref, "node_modules", "@huggingface", "jinja")):
    print("skipped: no node_modules (cd tests/reference && npm install)")
    sys.exit(77)
live = subprocess.run(["node", os.path.join(ref, "chat_render.mjs"), os.path.join(data, "cases.json")],
                      check=True, capture_output=True, text=True).stdout
with open(os.path.join(data, "expected.json"), encoding="utf-8") as f:
    committed = json.load(f)
if json.loads(live) != committed:
    print("expected.json is stale: regenerate it with "
          "node tests/reference/chat_render.mjs tests/data/chat_templates/cases.json")
    sys.exit(1)
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    f.write(live)
try:
    env = dict(os.environ, LATHE_CHAT_EXPECTED=f.name)
    rc = subprocess.run([sys.argv[1], "--filter", "chat/published_templates_render_as_the_reference_does"],
                        env=env).returncode
finally:
    os.unlink(f.name)
print("chat_reference: %d cases, rc %d" % (len(committed), rc))
sys.exit(rc)
