#!/usr/bin/python3
"""layers: the house rules of the tree, checked (docs/STYLE.md, docs/DESIGN.md §10).

1. Includes follow the layers. A file may include headers of its own folder and of the folders
   below it, never above: src/lib -> nothing else; workers/engine and kernels -> lt_base only
   (lt_err.h, lt_time.h, lt_rand.h); src/control -> src/lib; workers -> src/lib, workers/engine;
   src/cli -> everything. lt_config.h (generated) is allowed where noted.
2. Links follow the layers: every lt_ symbol a layer's static library leaves undefined is
   defined by a library of its own layer or one below (nm over the built libraries).
3. Sizes: no source file in src/ or workers/ over 1,200 lines, no function over 120 lines.
4. The repository cites its own docs: no file points outside it or at tracker issue numbers.

usage: layers.py SOURCE_ROOT [BUILD_DIR]      Prints one line per violation; exit 1 if any.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(sys.argv[1])
BUILD = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else None
MAX_FILE, MAX_FUNC = 1200, 120
BASE = {"lt_err.h", "lt_time.h", "lt_rand.h"}  # lt_base: what the engine may use of src/lib

# folder -> folders whose headers it may include (its own first), and extra allowed headers
LAYERS = {
    "src/lib": (["src/lib"], {"lt_config.h"}),
    "kernels": (["kernels"], BASE),
    "workers/engine": (["workers/engine", "kernels"], BASE),
    "src/control": (["src/control", "src/lib"], {"lt_config.h"}),
    "workers": (["workers", "workers/engine", "src/lib"], {"lt_config.h"}),
    "src/cli": (["src/cli", "src/control", "workers", "workers/engine", "src/lib"], {"lt_config.h"}),
}
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")


def tracked(*paths):
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "--", *paths], capture_output=True,
                         text=True, check=True).stdout.split()
    return [p for p in out if os.path.exists(os.path.join(ROOT, p))]


def layer_of(path):
    folder = os.path.dirname(path)
    return folder if folder in LAYERS else None


def headers_by_folder():
    where = {}
    for p in tracked(*LAYERS):
        if p.endswith((".h", ".cuh")):
            where.setdefault(os.path.basename(p), set()).add(os.path.dirname(p))
    return where


def check_includes(problems):
    where = headers_by_folder()
    for p in tracked(*LAYERS):
        layer = layer_of(p)
        if not layer or not p.endswith(SOURCE_EXT):
            continue
        allowed, extra = LAYERS[layer]
        for n, line in enumerate(open(os.path.join(ROOT, p), errors="replace"), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            h = os.path.basename(m.group(1))
            if h in extra:
                continue
            homes = where.get(h, set())
            if not homes:
                problems.append(f"{p}:{n}: includes \"{h}\", which no layer folder has")
            elif not homes & set(allowed) - ({"src/lib"} if layer in ("workers/engine", "kernels") else set()):
                problems.append(f"{p}:{n}: {layer} includes \"{h}\" of {', '.join(sorted(homes))}, "
                                f"a layer it may not use")


def nm(lib):
    out = subprocess.run(["nm", "--defined-only", "-g", lib], capture_output=True, text=True).stdout
    defined = {l.split()[-1] for l in out.splitlines() if re.match(r"^[0-9a-f]+ [TDBRC] ", l)}
    out = subprocess.run(["nm", "-u", lib], capture_output=True, text=True).stdout
    undef = {l.split()[-1] for l in out.splitlines() if l.strip().startswith("U ")}
    return defined, undef


def check_links(problems):
    """Static libraries and the libraries each layer may link (its own and those below)."""
    libs = {
        "ltbase": ("src/lib/libltbase.a", []),
        "lathe": ("src/lib/liblathe.a", ["ltbase"]),
        "ltcontrol": ("src/control/libltcontrol.a", ["lathe", "ltbase"]),
        "lt_tok": ("workers/engine/liblt_tok.a", ["ltbase"]),
        "ltengine": ("workers/engine/libltengine.a", ["lt_tok", "ltbase", "lathe_kernels"]),
        "ltworker": ("workers/libltworker.a", ["ltengine", "lt_tok", "lathe", "ltbase", "lathe_kernels"]),
    }
    syms = {}
    for name, (rel, _) in list(libs.items()) + [("lathe_kernels", ("kernels/liblathe_kernels.a", []))]:
        path = os.path.join(BUILD, rel)
        if os.path.exists(path):
            syms[name] = nm(path)
    for name, (rel, below) in libs.items():
        if name not in syms:
            problems.append(f"{rel}: not built in {BUILD}")
            continue
        defined, undef = syms[name]
        ok = set(defined)
        for b in below:
            ok |= syms.get(b, (set(), set()))[0]
        for s in sorted(undef):
            if re.match(r"^lt_", s) and s not in ok:
                owner = [n for n, (d, _) in syms.items() if s in d]
                problems.append(f"{rel}: needs {s} from {', '.join(owner) or 'nowhere'}, "
                                f"a layer it may not link")


def strip_c(src):
    """Comments and literals removed, newlines kept: braces then mean code."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * src.count("\n", i, j))
            i = j
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src[i] in "\"'":
            q, j = src[i], i + 1
            while j < n and src[j] != q:
                j += 2 if src[j] == "\\" else 1
            out.append(q + q)
            i = j + 1
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


def functions(text):
    """(name, first line, lines) of each top-level function body in C text."""
    lines = strip_c(text).split("\n")
    depth, found, start, name = 0, [], None, None
    for ln, line in enumerate(lines):
        if line.startswith("#"):
            continue
        for ch in line:
            if ch == "{":
                if depth == 0:
                    j, head = ln, ""
                    while j >= 0 and j > ln - 6:
                        head = lines[j] + " " + head
                        if re.match(r"^[A-Za-z_]", lines[j]):
                            break
                        j -= 1
                    before = head.split("(")[0]
                    names = re.findall(r"(\w+)\s*\(", head)
                    is_func = names and "=" not in before and not re.match(
                        r"^\s*(struct|enum|union|typedef)\b[^(]*$", before)
                    start, name = (j, names[0]) if is_func else (None, None)
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0 and start is not None:
                    found.append((name, start + 1, ln - start + 1))
                    start = None
    return found


def check_sizes(problems):
    for p in tracked("src", "workers"):
        if not p.endswith((".c", ".h")):
            continue
        text = open(os.path.join(ROOT, p), errors="replace").read()
        n = text.count("\n")
        if n > MAX_FILE:
            problems.append(f"{p}: {n} lines (at most {MAX_FILE})")
        if p.endswith(".c"):
            for name, line, length in functions(text):
                if length > MAX_FUNC:
                    problems.append(f"{p}:{line}: function {name} has {length} lines (at most {MAX_FUNC})")


def check_citations(problems):
    outside = re.escape("..") + "/" + "shared"            # spelled apart: this file is tracked too
    tracker = "issue" + r" [0-9]"
    out = subprocess.run(["git", "-C", ROOT, "grep", "-n", "-I", "-E", f"{outside}|{tracker}"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        problems.append(f"{line}: cites what a clone of the repository does not have")


def main():
    problems = []
    check_includes(problems)
    if BUILD:
        check_links(problems)
    check_sizes(problems)
    check_citations(problems)
    for p in problems:
        print(p)
    print(f"layers: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
