#!/usr/bin/env bash
# Two jobs on one GPU, one budget: the example workload twice at once under `cupool run --share`,
# each waiting for the other's idle memory rather than failing, and `cupool top` while they run.
# On the GPU if there is one (nvcc and nvidia-smi), else on cupool's simulated CUDA (--sim).
#   examples/share/two_jobs.sh [BUILD_DIR] [BUDGET]     (BUDGET: CUPOOL_SHARE_LIMIT, default 320MiB)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
limit=${2:-320MiB}
cupool=$build/tools/cupool
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
name=two-jobs-$$
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && command -v nvcc >/dev/null 2>&1; then
  nvcc -O2 -cudart shared -o "$out/workload" "$root/examples/workload.cpp"
  program=("$out/workload" 200 4) where=()
else
  program=("$build/examples/workload_sim" 200 4) where=(--sim)
fi
echo "two jobs, one budget \"$name\" of $limit${where:+ (simulated CUDA)}"
for job in a b; do
  "$cupool" run "${where[@]}" --policy growth --share "$name" --share-limit "$limit" --share-wait 60s \
    --trace "$out/$job.%p.jsonl" -- "${program[@]}" >"$out/$job.out" 2>"$out/$job.err" &
  pids+=($!)
done
sleep 0.5
"$cupool" top --once 2>/dev/null | sed -n "/budget $name/,/^$/p" || true
status=0
for i in 0 1; do wait "${pids[$i]}" || status=1; done
for job in a b; do
  echo "job $job: $(tail -1 "$out/$job.out") $(grep '^cupool: device' "$out/$job.err" || grep cupool "$out/$job.err" | tail -1)"
done
"$cupool" report "$out"/a.*.jsonl "$out"/b.*.jsonl | sed -n '1,12p'
exit $status
