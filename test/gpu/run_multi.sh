#!/usr/bin/env bash
# The checks that need two GPUs (kind nvidia-h200-x2) or two processes: NCCL data-parallel
# training and CUDA IPC through torch.multiprocessing, each without cupool and under it.
#   test/gpu/run_multi.sh BUILD_DIR OUT
set -uo pipefail
build=$(cd "$1" && pwd) out=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out" /tmp/cupool-multi
cupool=$build/tools/cupool
export CUPOOL_LOG_LEVEL=warn PYTHONUNBUFFERED=1
echo "gpus: $(nvidia-smi -L | wc -l) x $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); $(date -u +%F)"
run() { echo "== $1"; shift; timeout 240 "$@" 2>&1 | grep -E '^\{|cupool|Error|error' | tail -8; }
run "ddp, no cupool" torchrun --standalone --nproc_per_node=2 "$here/ddp_check.py"
run "ddp, cupool growth" "$cupool" run --policy growth --trace /tmp/cupool-multi/ddp.%p.jsonl -- \
    torchrun --standalone --nproc_per_node=2 "$here/ddp_check.py"
for t in /tmp/cupool-multi/ddp.*.jsonl; do
  "$cupool" report --json "$t" | python3 -c "import json,sys; d=json.load(sys.stdin)['traces'][0]; print('trace', d.get('pid'), [(x['device'], x['allocs'], x['peak_reserved']) for x in d['devices']])"
done
echo "== ipc probe (the driver's handles, no cupool)"
nvcc -O1 -arch=sm_90 -o /tmp/cupool-multi/ipc_probe "$here/ipc_probe.cu" -lcuda &&
  { /tmp/cupool-multi/ipc_probe export & sleep 3; /tmp/cupool-multi/ipc_probe import; wait;
    /tmp/cupool-multi/ipc_probe sizes; }
echo "== prog_ipc (test/integration/programs/prog_ipc.cpp on the real driver)"
nvcc -O2 -arch=sm_90 -x cu -I"$here/../integration/programs" -o /tmp/cupool-multi/prog_ipc \
  "$here/../integration/programs/prog_ipc.cpp" -lcuda &&
  for pol in none passthrough growth preallocate; do
    if [[ $pol == none ]]; then out=$(/tmp/cupool-multi/prog_ipc 2>&1)
    else out=$(CUPOOL_POLICY=$pol CUPOOL_PREALLOCATE=20% LD_PRELOAD=$build/shim/libcupool.so /tmp/cupool-multi/prog_ipc 2>&1); fi
    echo "$pol: rc=$? $(tail -3 <<<"$out")"
  done
run "ipc, no cupool" python3 "$here/ipc_check.py"
run "ipc, cupool passthrough" "$cupool" run --policy passthrough --no-summary -- python3 "$here/ipc_check.py"
run "ipc, cupool growth" "$cupool" run --policy growth --no-summary -- python3 "$here/ipc_check.py"
run "ipc, cupool growth deferred" "$cupool" run --policy growth --free deferred --no-summary -- python3 "$here/ipc_check.py"
run "ipc, cupool preallocate 30%" "$cupool" run --policy preallocate --preallocate 30% --no-summary -- python3 "$here/ipc_check.py"
