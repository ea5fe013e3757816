#!/usr/bin/env bash
# cupool's developer entry point. README.md names its two uses:
#   ./dev.sh run    install what is missing (Debian packages), build, and run the main job
#   ./dev.sh test   install what is missing, build (plain and ASan+UBSan), run the whole suite
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(meson ninja-build g++ pkg-config python3 libspdlog-dev libfmt-dev nlohmann-json3-dev catch2
          libasan8 libubsan1 libtsan2 chromium zlib1g-dev libzstd-dev zstd clang-14 libclang-rt-14-dev)
CUDA_DIR=${CUDA_DIR:-/usr/local/cuda}

install_missing() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "dev.sh: installing ${missing[*]}"
    local sudo=; [[ $(id -u) == 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if [[ ! -f $CUDA_DIR/include/cuda.h ]]; then
    echo "dev.sh: the CUDA toolkit headers are not under $CUDA_DIR (set CUDA_DIR=...)" >&2
    exit 1
  fi
}

build() {  # build DIR [meson options...]
  local dir=$1; shift
  if [[ ! -f $dir/build.ninja ]]; then
    meson setup "$dir" -Dcudatoolkit_dir="$CUDA_DIR" "$@" >"$dir.setup.log" 2>&1 \
      || { cat "$dir.setup.log"; exit 1; }
  fi
  ninja -C "$dir" >"$dir.build.log" 2>&1 || { tail -50 "$dir.build.log"; exit 1; }
  if grep -q "warning:" "$dir.build.log"; then
    grep -B2 -A5 "warning:" "$dir.build.log" | head -60
    echo "dev.sh: the build of $dir has compiler warnings" >&2
    exit 1
  fi
}

case "${1:-}" in
  run)
    install_missing
    build build
    exec examples/main_job.sh build
    ;;
  test)
    install_missing
    # Rebuild from scratch so that warnings are seen.
    rm -rf build-test build-asan
    build build-test
    build build-asan -Db_sanitize=address,undefined -Db_lundef=false
    status=0
    # Suite perf holds benchmarks (timings), run on their own: meson test -C build --suite perf
    meson test -C build-test --print-errorlogs --num-processes 2 --no-suite perf || status=1
    meson test -C build-asan --print-errorlogs --num-processes 2 --no-suite slow --no-suite perf || status=1
    # One closing line for both builds, counted from meson's own logs.
    python3 - build-test/meson-logs/testlog.json build-asan/meson-logs/testlog.json <<'PY'
import json, sys
counts = {"OK": 0, "FAIL": 0, "SKIP": 0}
for path in sys.argv[1:]:
    for line in open(path):
        r = json.loads(line).get("result")
        key = "OK" if r in ("OK", "EXPECTEDFAIL") else "SKIP" if r == "SKIP" else "FAIL"
        counts[key] += 1
print(f"{counts['OK']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
PY
    exit $status
    ;;
  *)
    echo "usage: ./dev.sh run | ./dev.sh test" >&2
    exit 2
    ;;
esac
