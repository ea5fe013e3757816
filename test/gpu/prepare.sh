#!/usr/bin/env bash
# Builds here everything the GPU run needs, for the device machine (which has no build
# packages): a release build of cupool, the CUDA programs of the checks and of the compatibility
# suite, and the reference workloads of ../shared, copied unchanged. Records which commit they
# come from; a tree with changes not committed is refused unless --allow-dirty (the build is then
# marked dirty in every results file).
#   test/gpu/prepare.sh [--allow-dirty]        then, on the device machine:
#   test/gpu/run_all.sh build-release .carry OUT [--only GROUP,...]
# (carry: .carry build-release/shim build-release/tools build-release/BUILD_ID)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
allow_dirty=0
[[ ${1:-} == --allow-dirty ]] && allow_dirty=1
id=$(git describe --always --dirty)
if [[ $id == *-dirty && $allow_dirty == 0 ]]; then
  echo "prepare.sh: the tree has changes that are not committed ($id); commit them, or pass --allow-dirty" >&2
  git status --short >&2
  exit 2
fi
build=build-release carry=.carry
[[ -f $build/build.ninja ]] || meson setup "$build" -Dcudatoolkit_dir="${CUDA_DIR:-/usr/local/cuda}" --buildtype=release >/dev/null
ninja -C "$build" shim/libcupool.so tools/cupool test/bench_share_startup >/dev/null
mkdir -p "$carry/bin" "$carry/workloads"
# The compatibility programs take minutes to build: kept when their sources have not changed
# since the commit they were built from (their own BUILD_ID says which; a dirty one is rebuilt).
compat_id=$(cat "$carry/compat/BUILD_ID" 2>/dev/null || true)
if [[ -n $compat_id && $compat_id != *-dirty ]] && git diff --quiet "$compat_id" HEAD -- test/gpu/compat shim/nvml_api.h 2>/dev/null; then
  echo "prepare.sh: the compatibility programs of $compat_id are kept (their sources are unchanged)"
else
  JOBS=${JOBS:-2} test/gpu/compat/build.sh "$carry/compat" >/dev/null
fi
arch=-arch=sm_90
nvcc -O2 $arch -cudart shared -o "$carry/bin/workload_shared" -x cu examples/workload.cpp
nvcc -O2 $arch -o "$carry/bin/workload_static" -x cu examples/workload.cpp
nvcc -O2 $arch -cudart shared -o "$carry/bin/inflight" test/gpu/inflight.cu
nvcc -O2 $arch -cudart shared -o "$carry/bin/bench_alloc" test/gpu/bench_alloc.cu
nvcc -O2 $arch -cudart shared -o "$carry/bin/peer_check" test/gpu/peer_check.cu -lcuda
nvcc -O2 $arch -cudart shared -o "$carry/bin/bench_vmm_calls" test/gpu/bench_vmm_calls.cu -lcuda
nvcc -O2 $arch -cudart shared -o "$carry/bin/clock_probe" test/gpu/clock_probe.cu -lcuda
nvcc -O2 $arch -cudart shared -o "$carry/bin/simple_ipc" test/gpu/simple_ipc.cu -lcuda
nvcc -O2 $arch -cudart shared -o "$carry/bin/prog_share" -x cu test/integration/programs/prog_share.cpp
# Issue 25's simulated-CUDA programs, against the real libcuda (the toolkit's link stub) and NVML
# (the suite's link stub): test/gpu/check_contextless.sh.
c++ -std=c++20 -O2 -I"${CUDA_DIR:-/usr/local/cuda}/include" -o "$carry/bin/prog_no_context" \
  test/integration/programs/prog_no_context.cpp -L"${CUDA_DIR:-/usr/local/cuda}/lib64/stubs" -lcuda -pthread
cc -O2 -I"${CUDA_DIR:-/usr/local/cuda}/include" -Ishim -o "$carry/bin/prog_nvml_linked" \
  test/integration/programs/prog_nvml_linked.c -L"${CUDA_DIR:-/usr/local/cuda}/lib64/stubs" -lcuda \
  -L"$carry/compat" -lnvidia-ml -pthread
cc -O2 -shared -fPIC -o "$carry/bin/pc_sampler.so" test/gpu/pc_sampler.c  # test/gpu/steady_profile.sh
cp "$build/test/bench_share_startup" "$carry/bin/"
cp ../shared/workloads/*.py "$carry/workloads/"
# The same identity for the library and the programs: what every results file names.
{ echo "commit=$id"; echo "built=$(date -u +%FT%TZ)"; echo "compiler=$(c++ --version | head -1)";
  echo "nvcc=$(nvcc --version | tail -1)"; } | tee "$build/BUILD_ID" > "$carry/BUILD_ID"
echo "prepare.sh: $id ready in $build and $carry"
