#!/usr/bin/env bash
# Builds the compatibility programs (test/gpu/compat/README.md) into OUTDIR.
#   test/gpu/compat/build.sh OUTDIR
# Environment: JOBS (parallel nvcc jobs, default: the number of cores), CUDA_HOME
# (/usr/local/cuda), NVCC ($CUDA_HOME/bin/nvcc, else nvcc on PATH), ARCH (sm_90),
# STRICT=1 (a warning fails the build).
# Writes OUTDIR/BUILD_ID (git describe --always --dirty of this checkout), OUTDIR/LINKS (each
# program and how it links the CUDA runtime) and OUTDIR/logs/<program>.log. Any compile error:
# the log is printed and the script exits 1.
set -uo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUTDIR" >&2
  exit 64
fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
mkdir -p "$1/logs" || exit 1
out=$(cd "$1" && pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [[ -z ${NVCC:-} ]]; then
  if [[ -x $CUDA_HOME/bin/nvcc ]]; then
    NVCC=$CUDA_HOME/bin/nvcc
  else
    NVCC=$(command -v nvcc || true)
    [[ -n $NVCC ]] && CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
  fi
fi
[[ -n $NVCC && -x $NVCC ]] || { echo "build.sh: nvcc not found (set NVCC or CUDA_HOME)" >&2; exit 1; }
JOBS=${JOBS:-$(nproc)}
ARCH=${ARCH:-sm_90}

common=(-O2 -arch="$ARCH" -std=c++17 -Xcompiler -Wall -Xlinker -rpath -Xlinker "$CUDA_HOME/lib64")
[[ ${STRICT:-0} == 1 ]] && common+=(-Werror all-warnings -Xcompiler -Werror)

# name | runtime (shared: -cudart shared, interposable at the runtime symbols; static: nvcc's
# default, only the driver is interposable) | source | extra flags
targets=(
  "stream_destroy|shared|stream_destroy.cu|"
  "stream_destroy_static|static|stream_destroy.cu|"
  "per_thread_stream|shared|per_thread_stream.cu|--default-stream per-thread"
  "per_thread_stream_explicit|shared|per_thread_stream.cu|-DCOMPAT_EXPLICIT_PER_THREAD"
  "capture|shared|capture.cu|"
  "graph_memory|shared|graph_memory.cu|"
  "arrays|shared|arrays.cu|"
  "arrays_driver|static|arrays_driver.cu|-lcuda"
  "last_error|shared|last_error.cu|-lcuda"
  "lib_cublas|shared|lib_cublas.cu|-lcublas"
  "lib_cufft|static|lib_cufft.cu|-lcufft"
  "lib_cusolver|shared|lib_cusolver.cu|-lcusolver"
  "lib_cusparse|shared|lib_cusparse.cu|-lcusparse"
  "lib_thrust_cub|static|lib_thrust_cub.cu|"
  "ipc_mempool|shared|ipc_mempool.cu|"
  "ipc_vmm|shared|ipc_vmm.cu|-lcuda"
  "cooperative|static|cooperative.cu|"
  "openmp_threads|shared|openmp_threads.cu|-Xcompiler -fopenmp -lgomp"
  "device_malloc|shared|device_malloc.cu|"
  "nvml_linked|shared|nvml_monitor.cu|-I$root/shim -L$out -lnvidia-ml"
  "nvml_dlopen_first|shared|nvml_monitor.cu|-I$root/shim -DCOMPAT_NVML_DLOPEN"
  "contexts_threads|static|contexts_threads.cu|-lcuda"
  "late_dlopen|static|late_dlopen.cu|"
  "exec_child|shared|exec_child.cu|"
)

build_one() {
  local name=$1 rt=$2 src=$3 extra=$4
  local log=$out/logs/$name.log
  rm -f "$out/$name"
  local -a cmd=("$NVCC" "${common[@]}" -o "$out/$name" "$here/$src")
  [[ $rt == shared ]] && cmd+=(-cudart shared)  # static: nvcc's default, no flag
  # shellcheck disable=SC2206  # extra flags are words on purpose
  [[ -n $extra ]] && cmd+=($extra)
  { printf '%q ' "${cmd[@]}"; echo; } >"$log"
  local t0=$SECONDS
  if "${cmd[@]}" >>"$log" 2>&1; then
    echo "built $name ($rt runtime, $((SECONDS - t0)) s)"
  else
    echo "FAILED $name: $log" >&2
    return 1
  fi
}

# NVML's link stub (nvml_stub.c): nvml_linked needs libnvidia-ml.so.1 as DT_NEEDED; the driver's
# own is loaded at run time.
cc -shared -fPIC -O2 -I"$root/shim" -Wl,-soname,libnvidia-ml.so.1 -o "$out/libnvidia-ml.so" "$here/nvml_stub.c" \
  || { echo "build.sh: the NVML link stub did not build" >&2; exit 1; }
git -C "$here" describe --always --dirty >"$out/BUILD_ID" 2>/dev/null || echo unknown >"$out/BUILD_ID"
: >"$out/LINKS"
echo "nvcc: $("$NVCC" --version | tail -1); $JOBS parallel jobs; into $out"
failed=0
running=0
for t in "${targets[@]}"; do
  IFS='|' read -r name rt src extra <<<"$t"
  echo "$name $rt" >>"$out/LINKS"
  build_one "$name" "$rt" "$src" "$extra" &
  running=$((running + 1))
  if ((running >= JOBS)); then
    wait -n || failed=1
    running=$((running - 1))
  fi
done
while ((running > 0)); do
  wait -n || failed=1
  running=$((running - 1))
done

warnings=$(grep -l -i 'warning' "$out"/logs/*.log 2>/dev/null || true)
if [[ -n $warnings ]]; then
  echo "warnings in:" >&2
  for w in $warnings; do
    echo "== $w" >&2
    grep -i -A3 'warning' "$w" >&2
  done
fi
if ((failed)); then
  for t in "${targets[@]}"; do
    name=${t%%|*}
    [[ -x $out/$name ]] && continue
    echo "==== $name: compile FAILED, log $out/logs/$name.log" >&2
    cat "$out/logs/$name.log" >&2
  done
  echo "build.sh: some programs did not build" >&2
  exit 1
fi
echo "build.sh: all ${#targets[@]} programs built into $out (BUILD_ID $(cat "$out/BUILD_ID"))"
