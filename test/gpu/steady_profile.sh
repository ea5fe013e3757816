#!/usr/bin/env bash
# Where the traced pool-hit pair's time goes on the GPU host (issue 38), with the ring never
# full: bench_alloc steady (512-byte cudaMalloc+cudaFree pairs in batches, the writer draining
# between them; each traced run's footer, kept, says whether any event was dropped) under
# test/gpu/pc_sampler.so, trace off and on, 1 and 8 threads, in alternating rounds. The sampler
# counts CPU time, so the pauses cost wall time only. Writes OUT/steady-host.txt (build, card, driver, CPU, clock sources), OUT/steady.jsonl
# (each run's min / median / max ns a pair over its batches) and OUT/steady-prof-TRACE-THREADS-rROUND.txt;
# name the functions here with test/gpu/pc_profile.py PROFILE libcupool.so (a -g build of the same commit).
#   test/gpu/steady_profile.sh BUILD_DIR CARRY_DIR OUT [ROUNDS]
set -u
build=$(cd "$1" && pwd) carry=$(cd "$2" && pwd) out=$3 rounds=${4:-2}
mkdir -p "$out"
lib=$build/shim/libcupool.so bin=$carry/bin
{ cat "$carry/BUILD_ID"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  lscpu | grep -E "Model name|^CPU\(s\)|Hypervisor"
  echo "clock sources: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource)"
  date -u; echo "command: $0 $*"; } > "$out/steady-host.txt" 2>&1
for ((r = 1; r <= rounds; r++)); do
  for tr in off on; do
    for t in 1 8; do
      trace=
      [[ $tr == on ]] && trace=/tmp/cupool-steady-$t.jsonl
      # timeout outside env: the sampler writes its profile at the program's exit, not timeout's.
      timeout 60 env LD_PRELOAD="$bin/pc_sampler.so:$lib" PC_SAMPLER_OUT="$out/steady-prof-$tr-$t-r$r.txt" \
        CUPOOL_POLICY=growth CUPOOL_FREE=deferred CUPOOL_TRACE_BUFFER=65536 CUPOOL_TRACE="$trace" \
        "$bin/bench_alloc" steady "$t" 6 | sed "s/}\$/, \"trace\": \"$tr\", \"round\": $r}/" >> "$out/steady.jsonl"
      echo "trace=$tr threads=$t round=$r rc=${PIPESTATUS[0]}" >> "$out/steady-host.txt"
      if [[ -n $trace ]]; then
        tail -c 400 "$trace" | grep footer >> "$out/steady-host.txt"
        rm -f "$trace"
      fi
    done
  done
done
cat "$out/steady.jsonl"
