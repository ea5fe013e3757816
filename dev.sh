#!/usr/bin/env bash
# cupool's developer entry point. README.md names its two uses:
#   ./dev.sh run    install what is missing (Debian packages), build, and run the main job
#   ./dev.sh test   install what is missing, build (plain and ASan+UBSan), run the whole suite
#   ./dev.sh stress share|trace [RUNS]   each test of the group RUNS times (200), three at a time
set -euo pipefail
cd "$(dirname "$0")"

# What `run` needs (a build of the library, the command, the simulated CUDA and the example),
# and what only the test suite adds (sanitizers, the HTML check's browser, the fuzzers' clang).
RUN_PACKAGES=(meson ninja-build g++ pkg-config python3 libspdlog-dev libfmt-dev nlohmann-json3-dev catch2
              zlib1g-dev libzstd-dev)
TEST_PACKAGES=(libasan8 libubsan1 libtsan2 chromium zstd clang-14 libclang-rt-14-dev)
CUDA_DIR=${CUDA_DIR:-/usr/local/cuda}
T0=$SECONDS

say() { echo "dev.sh [$((SECONDS - T0))s]: $*"; }

install_missing() {  # install_missing PACKAGE...
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    say "installing ${missing[*]} (Debian packages)"
    local sudo=; [[ $(id -u) == 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    say "the Debian packages it needs are there"
  fi
  if [[ ! -f $CUDA_DIR/include/cuda.h ]]; then
    echo "dev.sh: the CUDA toolkit headers are not under $CUDA_DIR (set CUDA_DIR=...)" >&2
    exit 1
  fi
}

# Runs ninja quietly, with a progress line at least every 15 s (a first build takes minutes on
# two cores).
ninja_with_progress() {  # ninja_with_progress DIR LOG [TARGET...]
  local dir=$1 log=$2; shift 2
  ninja -C "$dir" "$@" >"$log" 2>&1 &
  local pid=$! last=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS - last >= 15)); then
      last=$SECONDS
      say "building $dir: $(grep -o '^\[[0-9]*/[0-9]*\]' "$log" | tail -1 || true)"
    fi
  done
  wait "$pid"
}

build() {  # build DIR [meson options...] [-- TARGET...]
  local dir=$1; shift
  local opts=() targets=()
  while (($#)); do
    if [[ $1 == -- ]]; then shift; targets=("$@"); break; fi
    opts+=("$1"); shift
  done
  if [[ ! -f $dir/build.ninja ]]; then
    say "configuring $dir"
    meson setup "$dir" -Dcudatoolkit_dir="$CUDA_DIR" "${opts[@]}" >"$dir.setup.log" 2>&1 \
      || { cat "$dir.setup.log"; exit 1; }
  fi
  say "building $dir${targets:+ (${targets[*]})}"
  ninja_with_progress "$dir" "$dir.build.log" "${targets[@]}" || { tail -50 "$dir.build.log"; exit 1; }
  if grep -q "warning:" "$dir.build.log"; then
    grep -B2 -A5 "warning:" "$dir.build.log" | head -60
    echo "dev.sh: the build of $dir has compiler warnings" >&2
    exit 1
  fi
}

case "${1:-}" in
  run)
    say "checking what the main job needs"
    install_missing "${RUN_PACKAGES[@]}"
    # Only what the main job uses: the library, the command, the simulated CUDA, the example.
    build build -- shim/libcupool.so tools/cupool examples/workload_sim test/sim/libcuda.so.1 test/sim/libcudart.so.13 \
      test/sim/libnvidia-ml.so.1
    say "running the main job"
    exec examples/main_job.sh build
    ;;
  test)
    install_missing "${RUN_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
    # Rebuild from scratch so that warnings are seen.
    rm -rf build-test build-asan
    build build-test
    # The sanitized build at -O1 with line tables only (-g1: what the sanitizers' stack traces
    # need). At the project's -O2 -g it took about 11 of the 20 minutes this command may take
    # (docs/timings.md).
    build build-asan -Db_sanitize=address,undefined -Db_lundef=false -Doptimization=1 -Ddebug=false \
      -Dcpp_args=-g1 -Dc_args=-g1
    status=0
    # Suite perf holds benchmarks (timings), run on their own: meson test -C build --suite perf
    meson test -C build-test --print-errorlogs --num-processes 2 --no-suite perf || status=1
    meson test -C build-asan --print-errorlogs --num-processes 2 --no-suite slow --no-suite perf || status=1
    # Closing lines for both builds, counted from meson's own logs: every test that failed, by
    # build and name (a log's tail may show only the second build's run), then the counts.
    python3 - build-test/meson-logs/testlog.json build-asan/meson-logs/testlog.json <<'PY'
import json, sys
counts = {"OK": 0, "FAIL": 0, "SKIP": 0}
for path in sys.argv[1:]:
    for line in open(path):
        t = json.loads(line)
        r = t.get("result")
        key = "OK" if r in ("OK", "EXPECTEDFAIL") else "SKIP" if r == "SKIP" else "FAIL"
        counts[key] += 1
        if key == "FAIL":
            print(f"FAILED in {path.split('/')[0]}: {t.get('name')} ({r}, {t.get('duration', 0):.1f} s); its output's end:")
            print("\n".join("  | " + l for l in (t.get("stdout") or "").splitlines()[-25:]))
print(f"{counts['OK']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
PY
    exit $status
    ;;
  stress)
    # Races show up only under load: every test of the group, RUNS times, three at a time
    # (test/stress.py). On the plain build, kept between runs.
    install_missing "${RUN_PACKAGES[@]}"
    build build
    exec python3 test/stress.py build "${2:-share}" --runs "${3:-200}" --jobs 3
    ;;
  *)
    echo "usage: ./dev.sh run | ./dev.sh test | ./dev.sh stress share|trace [RUNS]" >&2
    exit 2
    ;;
esac
