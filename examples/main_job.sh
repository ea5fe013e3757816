#!/usr/bin/env bash
# The main job: the example workload under cupool (growth policy, deferred frees), a trace, and
# a report. On a machine with an NVIDIA GPU and nvcc the workload runs on the GPU; otherwise it
# runs on the project's simulated CUDA (test/sim), and says so.
#   examples/main_job.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=${CUPOOL_OUT:-$build/main-job}
mkdir -p "$out"
cupool=$build/tools/cupool

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && command -v nvcc >/dev/null 2>&1; then
  echo "main job: on the GPU ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
  nvcc -O2 -cudart shared -o "$out/workload" "$root/examples/workload.cpp"
  program=("$out/workload" 300 16)
else
  echo "main job: no GPU here; running on cupool's simulated CUDA (test/sim)"
  export LD_LIBRARY_PATH="$build/test/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  program=("$build/examples/workload_sim" 300 16)
fi

"$cupool" run --policy growth --free deferred --trace "$out/trace.jsonl" -- "${program[@]}"
"$cupool" report "$out/trace.jsonl"
"$cupool" report "$out/trace.jsonl" --html "$out/report.html" >/dev/null
cat <<EOF
main job: done. The trace is $out/trace.jsonl.
  reserved / in use: what the pool held from the device over what the program's blocks used, at
    their peaks (1.00 means nothing idle; growth's chunks and freed blocks make it larger).
  next: open $out/report.html (memory over time, fragmentation, latency)
        $cupool replay $out/trace.jsonl --policy growth,preallocate,vmm   (the same run under other policies)
        $cupool export --perfetto $out/trace.jsonl -o $out/run.perfetto.json   (or --memory-viz, --rmm-csv)
EOF
