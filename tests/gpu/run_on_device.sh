#!/usr/bin/env bash
# run_on_device.sh: on a machine with an NVIDIA GPU and nvcc (no meson, Criterion or Debian
# -dev packages needed), builds kernels/ + the cuda backend + the GPU test driver + the bench
# with nvcc and cc directly, runs the kernel tests against their C references, then the
# 1B-class LoRA bench (tokens/s, MFU). With the engine's C libraries at hand (on the machine, or
# carried as Debian packages in .gpudeps: tests/gpu/fetch_deps.sh) it also builds the engine and
# runs engine_parity (the engine on cuda against cpu: loss, gradients, AdamW, sampling) and
# bench_gpu_engine (a whole lt_engine training step, LM head, loss and AdamW included, tokens/s
# and MFU against the measured bf16 ceiling). Logs go to $OUT (default ./gpu-out).
#   tests/gpu/run_on_device.sh            from the repository root
# Environment: OUT, GENCODE (default sm_90; e.g. "-arch=native"), LATHE_PEAK_TFLOPS,
# BENCH_ARGS (default: the 1B shape, see bench_gpu.c), ENGINE_BENCH_ARGS (bench_gpu_engine.c),
# JOBS, STAGES (default "kernels bench engine": any of them, to split the work over two calls),
# REQUIRE_ENGINE=1 (a build of the engine that fails is a failure, not a skip). Typical run on an
# H200: the build 1-2 min, the stages 3-5 min; their timeouts add up to 8 min.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
OUT=${OUT:-$top/gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
say() { echo "== $*"; }
# stage SECONDS LOG CMD...: runs CMD under a timeout, its output to the terminal and $OUT/LOG;
# rc gets its exit status.
stage() { local t=$1 log=$2; shift 2; timeout "$t" "$@" 2>&1 | tee "$OUT/$log"; rc=${PIPESTATUS[0]}; }
work=$(mktemp -d)
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
GENCODE=${GENCODE:--gencode arch=compute_90,code=sm_90}

say "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi | tee "$OUT/nvidia-smi.txt"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee -a "$OUT/nvidia-smi.txt"
else
  say "nvidia-smi not found (continuing)"
fi

NVCC=$(command -v nvcc || true)
for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do [ -z "$NVCC" ] && [ -x "$c" ] && NVCC=$c; done
if [ -z "$NVCC" ]; then say "FATAL: nvcc not found"; exit 2; fi
CUDA_HOME=${CUDA_HOME:-$(cd "$(dirname "$(readlink -f "$NVCC")")/.." && pwd)}
# nvcc may be a wrapper outside the toolkit: find the directory that has the runtime headers
for c in "$CUDA_HOME" /usr/local/cuda /usr/local/cuda-*; do
  [ -f "$c/include/cuda_runtime_api.h" ] && { CUDA_HOME=$c; break; }
done
"$NVCC" --version | tail -n 2
CC=$(command -v cc || command -v gcc || true)
if [ -z "$CC" ]; then say "FATAL: no host C compiler (cc/gcc)"; exit 2; fi
say "nvcc: $NVCC  CUDA_HOME: $CUDA_HOME  cc: $CC  jobs: $JOBS"

# ---- cuBLAS and NCCL: toolkit, system, /opt/lathe-cuda, pip wheels installed or on disk ----
pydirs=$(python3 -c 'import site,sys; print(" ".join(site.getsitepackages()+[site.getusersitepackages()]))' 2>/dev/null || true)
cands="$CUDA_HOME /usr/local/cuda /opt/lathe-cuda /usr /usr/lib/x86_64-linux-gnu"
for d in $pydirs; do cands="$cands $d/nvidia/cu13 $d/nvidia/cublas $d/nvidia/nccl $d/nvidia/cu12"; done
find_pkg() { # header lib -> prints "incdir libdir"
  local h=$1 l=$2 p inc lib
  for p in $cands "$work/wheels/nvidia/cu13" "$work/wheels/nvidia/nccl"; do
    inc=""; lib=""
    for i in "$p/include" "$p/targets/x86_64-linux/include" "$p"; do [ -f "$i/$h" ] && { inc=$i; break; }; done
    for j in "$p/lib64" "$p/lib" "$p/targets/x86_64-linux/lib" "$p/x86_64-linux-gnu" "$p"; do
      ls "$j"/lib$l.so* >/dev/null 2>&1 && { lib=$j; break; }; done
    [ -n "$inc" ] && [ -n "$lib" ] && { echo "$inc $lib"; return 0; }
  done
  return 1
}
unpack_wheel() { # glob
  local w
  w=$(ls /opt/pypi-more/files/$1 2>/dev/null | sort -V | tail -n 1)
  [ -n "$w" ] || return 1
  say "unpacking $w"
  mkdir -p "$work/wheels" && (cd "$work/wheels" && unzip -q -o "$w" 'nvidia/*/include/*' 'nvidia/*/lib/*')
}
cublas=$(find_pkg cublas_v2.h cublas) || { unpack_wheel 'nvidia_cublas-*.whl' && cublas=$(find_pkg cublas_v2.h cublas); } || cublas=""
nccl=$(find_pkg nccl.h nccl) || { unpack_wheel 'nvidia_nccl_cu1*-*.whl' && nccl=$(find_pkg nccl.h nccl); } || nccl=""
if [ -z "$cublas" ]; then say "FATAL: cuBLAS (cublas_v2.h + libcublas.so) not found in: $cands"; exit 2; fi
say "cuBLAS: $cublas"
incs="-I$top/src/lib -I$top/kernels -I$top/workers/engine -I$CUDA_HOME/include"
libs=""
set -- $cublas; incs="$incs -I$1"; libs="$libs -L$2 -Xlinker -rpath=$2"; ldp="$2"
# versioned-only sonames (wheels): give the linker the plain name
mkdir -p "$work/lib"
for f in "$2"/libcublas.so.* "$2"/libcublasLt.so.*; do [ -e "$f" ] && ln -sf "$f" "$work/lib/$(basename "${f%%.so.*}").so"; done
nccl_src=""
if [ -n "$nccl" ]; then
  say "NCCL: $nccl"
  set -- $nccl; incs="$incs -I$1"; libs="$libs -L$2 -Xlinker -rpath=$2"; ldp="$ldp:$2"
  for f in "$2"/libnccl.so.*; do [ -e "$f" ] && ln -sf "$f" "$work/lib/libnccl.so"; done
  nccl_link="-lnccl"
else
  say "NCCL not found: building with a stub (multi-GPU all-reduce unavailable; kernels and bench unaffected)"
  mkdir -p "$work/ncclstub"
  cat > "$work/ncclstub/nccl.h" <<'H'
#ifndef NCCL_STUB_H
#define NCCL_STUB_H
#include <stddef.h>
#include <cuda_runtime_api.h>
#ifdef __cplusplus
extern "C" {
#endif
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
typedef enum { ncclSuccess = 0, ncclUnhandledCudaError, ncclSystemError, ncclInternalError,
  ncclInvalidArgument, ncclInvalidUsage, ncclRemoteError } ncclResult_t;
typedef enum { ncclFloat32 = 7 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclAvg = 4 } ncclRedOp_t;
const char *ncclGetErrorString(ncclResult_t r);
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId id, int rank);
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c, cudaStream_t st);
ncclResult_t ncclCommDestroy(ncclComm_t c);
#ifdef __cplusplus
}
#endif
#endif
H
  cat > "$work/ncclstub/nccl_stub.c" <<'C'
#include "nccl.h"
const char *ncclGetErrorString(ncclResult_t r) { (void)r; return "NCCL stub: not installed"; }
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) { (void)id; return ncclSystemError; }
ncclResult_t ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId id, int rank) { (void)c; (void)n; (void)id; (void)rank; return ncclSystemError; }
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c, cudaStream_t st) { (void)s; (void)r; (void)n; (void)t; (void)o; (void)c; (void)st; return ncclSystemError; }
ncclResult_t ncclCommDestroy(ncclComm_t c) { (void)c; return ncclSuccess; }
C
  incs="$incs -I$work/ncclstub"
  nccl_src="$work/ncclstub/nccl_stub.c"
  nccl_link=""
fi
libs="-L$work/lib $libs -L$CUDA_HOME/lib64 -Xlinker -rpath=$CUDA_HOME/lib64"
export LD_LIBRARY_PATH="$ldp:$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}"

# ---- build ----------------------------------------------------------------------------------
obj="$work/obj"; mkdir -p "$obj"
say "compiling kernels/*.cu ($GENCODE)"
ls kernels/*.cu | xargs -P "$JOBS" -I{} sh -c \
  '"$0" -O3 -std=c++17 '"$GENCODE"' --expt-relaxed-constexpr '"$incs"' -c {} -o "'"$obj"'/$(basename {} .cu).o" || { echo "BUILD FAILED: {}"; exit 255; }' "$NVCC" \
  > "$OUT/build.log" 2>&1
rc=$?; cat "$OUT/build.log"
[ $rc -eq 0 ] || { say "FATAL: kernel build failed (see build.log)"; exit 3; }
say "compiling C sources"
for f in src/lib/lt_err.c workers/engine/lt_backend_cuda.c tests/gpu/lt_gpu_cases.c tests/gpu/gpu_driver.c tests/gpu/bench_gpu.c $nccl_src; do
  "$CC" -std=gnu11 -O2 -D_GNU_SOURCE $incs -c "$f" -o "$obj/$(basename "$f" .c).o" >> "$OUT/build.log" 2>&1 \
    || { cat "$OUT/build.log"; say "FATAL: $f failed to compile"; exit 3; }
done
common="$obj/lt_err.o $obj/lt_backend_cuda.o $(ls "$obj"/lt_k_*.o "$obj"/lt_cuda_check.o) $( [ -n "$nccl_src" ] && echo "$obj/nccl_stub.o")"
"$NVCC" -o "$work/gpu_driver" "$obj/gpu_driver.o" "$obj/lt_gpu_cases.o" $common $libs -lcublas $nccl_link -lm >> "$OUT/build.log" 2>&1 \
  && "$NVCC" -o "$work/bench_gpu" "$obj/bench_gpu.o" $common $libs -lcublas $nccl_link -lm >> "$OUT/build.log" 2>&1 \
  || { cat "$OUT/build.log"; say "FATAL: link failed"; exit 3; }
say "build ok"

STAGES=${STAGES:-kernels bench engine}
want() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }
trc=0 brc=0 erc=0 ebrc=0
: > "$OUT/kernels.log"

# ---- kernel tests ---------------------------------------------------------------------------
if want kernels; then
  say "kernel tests (each kernel vs its C reference)"
  stage 120 kernels.log "$work/gpu_driver"; trc=$rc
  say "kernel tests exit status: $trc"
fi

# ---- bench ----------------------------------------------------------------------------------
if want bench; then
  say "bench: 1B-class LoRA layer stack, bf16, forward+backward"
  stage 120 bench.log "$work/bench_gpu" ${BENCH_ARGS:-}; brc=$rc
  say "bench exit status: $brc"
  if [ -z "${BENCH_ARGS:-}" ] && [ $brc -eq 0 ]; then
    say "bench: same model, B=8 x T=1024"
    stage 60 bench_t1024.log "$work/bench_gpu" 16 2048 32 8 8192 8 1024 16 5
  fi
fi

# ---- the engine end to end --------------------------------------------------------------------
# The engine links OpenBLAS, jansson, PCRE2 and xxHash: the machine's own when its compiler finds
# them, else the .deb files carried in .gpudeps, unpacked under $work (never into /).
deps="$work/deps"
dinc="" dlib=""
glibc=$(ldd --version 2>/dev/null | head -n 1 | grep -o -E '[0-9]+\.[0-9]+$' || echo 0)
if ! want engine; then
  :
elif ls "$top"/.gpudeps/*.deb >/dev/null 2>&1 && [ "$(printf '%s\n2.34\n' "$glibc" | sort -V | head -n 1)" != 2.34 ]; then
  say "engine: the carried packages (Debian 12) need glibc 2.34 or later; this machine has $glibc"
elif ls "$top"/.gpudeps/*.deb >/dev/null 2>&1; then
  mkdir -p "$deps"
  for f in "$top"/.gpudeps/*.deb; do
    dpkg-deb -x "$f" "$deps" 2>/dev/null || (cd "$deps" && ar p "$f" data.tar.xz | tar -xJ) \
      || say "could not unpack $f"
  done
  ml="$deps/usr/lib/x86_64-linux-gnu"
  dinc="-I$deps/usr/include -I$deps/usr/include/x86_64-linux-gnu/openblas-pthread"
  dlib="-L$ml -L$ml/openblas-pthread -Xlinker -rpath=$ml -Xlinker -rpath=$ml/openblas-pthread"
  export LD_LIBRARY_PATH="$ml:$ml/openblas-pthread:$LD_LIBRARY_PATH"
fi
eobj="$work/eobj"; mkdir -p "$eobj"
ebuild=0
# ecc FILE: compiles one engine source (the flags its meson library gives it) or leaves FILE.fail
ecc() {
  local f=$1 fl="-O2"
  case $f in
    */lt_backend_cpu.c|*/lt_cpu_amx.c) fl="-O3 -fno-math-errno -ffp-contract=off" ;;
    */lt_cpu_attn.c|*/lt_cpu_ew.c) fl="-O3 -fno-math-errno -ffp-contract=off -fno-trapping-math" ;;
  esac
  "$CC" -std=gnu11 $fl -D_GNU_SOURCE -pthread $incs $dinc -c "$f" -o "$eobj/$(basename "$f" .c).o" \
    > "$eobj/$(basename "$f").log" 2>&1 || touch "$eobj/$(basename "$f").fail"
}
if want engine; then
  say "engine: compiling workers/engine with the cuda backend"
  ebuild=1
  for f in workers/engine/*.c tests/gpu/engine_parity.c tests/gpu/bench_gpu_engine.c; do
    case $f in */lt_backend_cuda_stub.c|*/lt_backend_cuda.c) continue ;; esac # cuda: built above
    ecc "$f" &
    [ "$(jobs -r | wc -l)" -ge "$JOBS" ] && wait -n
  done
  wait
  cat "$eobj"/*.log >> "$OUT/engine-build.log" 2>/dev/null
  if ls "$eobj"/*.fail >/dev/null 2>&1; then
    ebuild=0
    say "engine: $(cd "$eobj" && ls *.fail | sed 's/.fail$//' | tr '\n' ' ')failed to compile (engine-build.log; tests/gpu/fetch_deps.sh brings the libraries)"
  fi
fi
if [ $ebuild -eq 1 ]; then
  eall=$(ls "$eobj"/*.o | grep -v -e /engine_parity.o -e /bench_gpu_engine.o)
  for t in engine_parity bench_gpu_engine; do
    "$NVCC" -o "$work/$t" "$eobj/$t.o" $eall $common $libs $dlib -lcublas $nccl_link \
      -lopenblas -ljansson -lpcre2-8 -lxxhash -lpthread -lm >> "$OUT/engine-build.log" 2>&1 \
      || { ebuild=0; say "engine: $t failed to link (engine-build.log)"; }
  done
fi
if [ $ebuild -eq 1 ]; then
  say "engine parity: cuda against cpu"
  stage 100 engine_parity.log "$work/engine_parity"; erc=$rc
  say "engine parity exit status: $erc"
  say "bench: lt_engine's whole step on cuda, bf16"
  stage 180 bench_engine.log "$work/bench_gpu_engine" ${ENGINE_BENCH_ARGS:-}; ebrc=$rc
  say "bench_gpu_engine exit status: $ebrc"
elif want engine; then
  tail -n 20 "$OUT/engine-build.log"
  if [ "${REQUIRE_ENGINE:-0}" = 1 ]; then erc=3; else erc=77; say "engine: skipped (no build; REQUIRE_ENGINE=1 makes it a failure)"; fi
fi

say "summary"
tail -n 1 "$OUT/kernels.log"
[ -f "$OUT/engine_parity.log" ] && tail -n 1 "$OUT/engine_parity.log"
grep -h -E '^(device|shape|best step|gpu_lora_|gpu_engine_)' "$OUT"/bench*.log 2>/dev/null
rm -rf "$work"
[ "$trc" -eq 0 ] && [ "$brc" -eq 0 ] && { [ "$erc" -eq 0 ] || [ "$erc" -eq 77 ]; } && [ "$ebrc" -eq 0 ]
