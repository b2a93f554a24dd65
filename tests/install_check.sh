#!/usr/bin/env bash
# install: `meson install --destdir` gives lathe and lathed that run from the install prefix
# with no source tree: schemas and ops/topics.tsv are compiled in, the topics file is installed
# beside them, and no path of the checkout is in the programs' data (debug info aside).
# usage: install_check.sh BUILD_DIR SOURCE_ROOT   (the stack's LATHE_KAFKA_* in the environment)
set -uo pipefail
build=$1 src=$2
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi; }

dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
meson install -C "$build" --no-rebuild --destdir "$dest" --quiet >"$dest.log" 2>&1 \
  || { cat "$dest.log"; echo "FAIL: meson install"; exit 1; }
rm -f "$dest.log"
bin=$(dirname "$(find "$dest" -type f -name lathe -perm -u+x | head -n 1)")
share=$(dirname "$(find "$dest" -type f -name topics.tsv | head -n 1)")
check "lathe and lathed installed ($bin)" '[ -x "$bin/lathe" ] && [ -x "$bin/lathed" ]'
check "topics.tsv installed ($share)" 'cmp -s "$share/topics.tsv" "$src/ops/topics.tsv"'

for b in lathe lathed; do
  objcopy -O binary --only-section=.rodata "$bin/$b" "$dest/$b.rodata"
  check "$b's data names no path of the checkout" '! grep -q -F "$src" "$dest/$b.rodata"'
done

# Run from an empty directory with the environment a user would have: nothing points at the
# checkout. Every schema version is there (compiled in).
cd "$dest" || exit 1
n=$(env -u LATHE_SOURCE_ROOT "$bin/lathe" record schemas 2>/dev/null | grep -c 'v[0-9]')
want=$(ls "$src"/schemas/*.avsc | wc -l)
check "installed lathe lists all $want schema versions (got $n)" '[ "$n" -eq "$want" ]'

# The topics, from the built-in copy, on the real broker under a scratch prefix.
if [ -n "${LATHE_KAFKA_BOOTSTRAP:-}" ]; then
  prefix="install$$-$RANDOM."
  out=$(env -u LATHE_SOURCE_ROOT -u LATHE_TOPICS_FILE LATHE_TOPIC_PREFIX=$prefix "$bin/lathe" admin topics 2>&1)
  want=$(grep -v '^#' "$src/ops/topics.tsv" | grep -c '[^[:space:]]')
  check "installed lathe creates the $want topics of its built-in topics file ($out)" \
    'echo "$out" | grep -q "^$want topic(s) created from the built-in"'
else
  echo "FAIL: LATHE_KAFKA_BOOTSTRAP is not set (ops/test sets it)"; fail=1
fi

# lathed answers --help from the install prefix (it loads no file to do so). Read whole: grep -q
# would close the pipe at its first match, and a help longer than a pipe's first write then ends
# lathed with SIGPIPE, which pipefail reports.
check "installed lathed runs" 'help=$(env -u LATHE_SOURCE_ROOT "$bin/lathed" --help 2>&1) && grep -q -- "--role" <<<"$help"'
exit $fail
