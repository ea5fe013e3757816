#!/usr/bin/env bash
# Builds the CUDA programs of the GPU checks with nvcc and runs every GPU check and benchmark.
#   test/gpu/run_all.sh BUILD_DIR WORKLOADS_DIR OUT [--only GROUP,...]
# BUILD_DIR is a build of this project made elsewhere (libcupool.so is self-contained);
# WORKLOADS_DIR holds the reference workloads of shared/FACTS.md (transformer_step.py, jax_mlp_step.py).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$1 workloads=$2 out=$3; shift 3
bin=${CUPOOL_GPU_BIN:-/tmp/cupool-gpu-bin}
mkdir -p "$bin" "$out"
echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); $(date -u +%F)"
arch=-arch=sm_90
nvcc -O2 $arch -cudart shared -o "$bin/workload_shared" -x cu "$root/examples/workload.cpp" &
nvcc -O2 $arch -o "$bin/workload_static" -x cu "$root/examples/workload.cpp" &
nvcc -O2 $arch -cudart shared -o "$bin/inflight" "$here/inflight.cu" &
nvcc -O2 $arch -cudart shared -o "$bin/bench_alloc" "$here/bench_alloc.cu" &
wait
python3 "$here/run_all.py" "$build" "$workloads" "$bin" "$out" "$@"
