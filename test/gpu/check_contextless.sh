#!/usr/bin/env bash
# Issue 25 on the real driver: the simulated-CUDA programs prog_no_context (cuMemCreate from
# threads with no context, a stream's context, two cuCtxCreate contexts of one device) and
# prog_nvml_linked (a C monitor linked against libcuda and NVML), built here against the real
# libraries, without cupool and under every mode, with and without a cap. Each run must exit 0,
# and its trace must hold the program's own count of creations (the calls were intercepted).
#   test/gpu/check_contextless.sh BUILD_DIR BIN_DIR OUT
set -uo pipefail
build=$1 bin=$2 out=$3
shim=$build/shim/libcupool.so
log=$out/contextless.txt
status=0
{
  echo "# check_contextless.sh: $(cat "$build/BUILD_ID" | tr '\n' ' ')"
  echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
} | tee "$log"
run() {  # label, then env assignments and the program
  local label=$1; shift
  local tmp; tmp=$(mktemp -d)
  local rc=0
  env -u CUPOOL_RUN_HEADER CUPOOL_TRACE="$tmp/t.%p.jsonl" "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  local creates; creates=$(cat "$tmp"/t.*.jsonl 2>/dev/null | grep -c '"ev":"vmm_create","api":"cuMemCreate"' || true)
  local verdict=ok
  [[ $rc == 0 ]] || verdict=FAIL
  # Under cupool, prog_no_context's four cuMemCreate calls are each one event (refused or not):
  # fewer means the calls were not intercepted, and the run tested nothing.
  if [[ $label == "prog_no_context "* && $label != *native* && $creates -lt 4 ]]; then verdict="FAIL (not intercepted)"; rc=99; fi
  printf '%-52s exit %3d  cuMemCreate events %s  %s\n' "$label" "$rc" "$creates" "$verdict" | tee -a "$log"
  if [[ $rc != 0 ]]; then status=1; sed 's/^/    /' "$tmp/err" | tail -5 | tee -a "$log"; fi
  rm -rf "$tmp"
}
run "prog_no_context native" "$bin/prog_no_context"
run "prog_nvml_linked native" "$bin/prog_nvml_linked"
for mode in passthrough:sync growth:sync growth:deferred preallocate:sync preallocate:deferred vmm:sync vmm:deferred; do
  p=${mode%%:*} f=${mode##*:}
  base=(LD_PRELOAD="$shim" CUPOOL_POLICY=$p CUPOOL_FREE=$f CUPOOL_PREALLOCATE=32MiB)
  run "prog_no_context $p $f" "${base[@]}" "$bin/prog_no_context"
  run "prog_no_context $p $f CUPOOL_LIMIT=48MiB" "${base[@]}" CUPOOL_LIMIT=48MiB PROG_CAP_MIB=48 "$bin/prog_no_context"
  run "prog_no_context $p $f CUPOOL_LIMIT=160MiB" "${base[@]}" CUPOOL_LIMIT=160MiB PROG_CAP_MIB=160 "$bin/prog_no_context"
  run "prog_no_context $p $f shared budget 48MiB" "${base[@]}" CUPOOL_SHARE=gpu-contextless-$$ CUPOOL_SHARE_LIMIT=48MiB \
    PROG_CAP_MIB=48 "$bin/prog_no_context"
  # (preallocate's default region: the program's 64 MiB must fit in it)
  run "prog_nvml_linked $p $f" LD_PRELOAD="$shim" CUPOOL_POLICY=$p CUPOOL_FREE=$f "$bin/prog_nvml_linked"
  run "prog_nvml_linked $p $f CUPOOL_LIMIT=1GiB" LD_PRELOAD="$shim" CUPOOL_POLICY=$p CUPOOL_FREE=$f CUPOOL_LIMIT=1GiB \
    PROG_EXPECT_TOTAL=1073741824 "$bin/prog_nvml_linked"
done
echo "check_contextless.sh: $([[ $status == 0 ]] && echo 'every run passed' || echo 'SOME RUNS FAILED')" | tee -a "$log"
exit $status
