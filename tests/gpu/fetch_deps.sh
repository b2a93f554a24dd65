#!/usr/bin/env bash
# fetch_deps.sh: downloads (here, from Debian's archive) the C libraries the engine links —
# OpenBLAS, jansson, PCRE2, xxHash and their runtime needs — as .deb files into .gpudeps/ at the
# repository root (ignored by git), for run_on_device.sh on a GPU machine that has nvcc but not
# these libraries: carry .gpudeps with the call, and the script unpacks them into its scratch
# directory (never into /). About 14 MB.
#   tests/gpu/fetch_deps.sh
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$top/.gpudeps"
cd "$top/.gpudeps"
apt-get download libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libgfortran5 \
  libquadmath0 libjansson4 libjansson-dev libpcre2-8-0 libpcre2-dev libxxhash0 libxxhash-dev
ls -l "$top/.gpudeps"
