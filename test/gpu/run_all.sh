#!/usr/bin/env bash
# Every GPU check and benchmark of cupool, on the device machine, over what test/gpu/prepare.sh
# built here. Prints the build, GPU, driver and library versions first (they head every results
# file too), and exits non-zero if any check failed or did not exercise what it claims.
#   test/gpu/run_all.sh BUILD_DIR CARRY_DIR OUT [--only GROUP,...]
#   test/gpu/run_all.sh BUILD_DIR CARRY_DIR OUT --docs --part K/2
#   test/gpu/run_all.sh BUILD_DIR CARRY_DIR OUT --verify BEFORE_BUILD
# --verify: a library change in one call (~200 s on the H200): the compatibility suite, the
# threads without a context, the sharing checks (share-budget, share-hostile, share_race.py: 8
# members, 4 in PID namespaces of their own), then test/gpu/compare_builds.py BEFORE_BUILD (shim/
# and BUILD_ID of the build before the change, carried) against BUILD_DIR, 3 alternating rounds.
# --docs: everything the measured pages quote but the default-policy decision (a run of its own,
# --only defaultpolicy), in two parts of one device call each (about 430 and 330 s estimated for
# the H200, under the 600 s a call may run; test/gpu/docs_plan.py says which groups, with what
# settings, and its estimates; part 1 runs the compatibility suite beside group compat, inside
# run_all.py); the output is also written to OUT/run.log. Then, here:
#   test/gpu/docs_plan.py save FILES_AT/OUT docs/gpu-runs/DATE-docsK   (each part), and
#   test/gpu/docs_tables.py .                                         (the pages from them).
# Groups: suite (test/gpu/compat), contextless (check_contextless.sh), compat, inflight, bench, rounds, steps, quarantine, vmm,
# xlasync, policies, replay, share, sharing, nvml, memviz, vmmpolicy, stacks, defaultpolicy (run_all.py's docstring says what each measures).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
command_line="$0 $*"
build=$(cd "$1" && pwd) carry=$(cd "$2" && pwd) out=$3; shift 3
mkdir -p "$out"
groups=all
before=
if [[ ${1:-} == --verify ]]; then
  if [[ ! -f ${2:-}/shim/libcupool.so ]]; then
    echo "run_all.sh: --verify BEFORE_BUILD (a build with shim/libcupool.so and BUILD_ID)" >&2
    exit 2
  fi
  before=$(cd "$2" && pwd)
  groups=suite,contextless,share
  exec > >(tee "$out/run.log") 2>&1
elif [[ ${1:-} == --docs ]]; then
  if [[ ${2:-} != --part || -z ${3:-} ]]; then
    echo "run_all.sh: --docs --part K/2 (one device call each; test/gpu/docs_plan.py lists them)" >&2
    exit 2
  fi
  plan=$(python3 "$here/docs_plan.py" groups "$3") || exit 2
  groups=$(head -1 <<<"$plan")
  while IFS= read -r setting; do export "$setting"; done < <(tail -n +2 <<<"$plan")
  exec > >(tee "$out/run.log") 2>&1
elif [[ ${1:-} == --only ]]; then
  groups=$2
fi
if [[ ! -f $build/BUILD_ID ]]; then
  echo "run_all.sh: $build/BUILD_ID is missing: build with test/gpu/prepare.sh" >&2
  exit 2
fi
if ! cmp -s "$build/BUILD_ID" "$carry/BUILD_ID"; then
  echo "run_all.sh: the library ($build/BUILD_ID) and the programs ($carry/BUILD_ID) come from different builds" >&2
  exit 2
fi
export CUPOOL_RUN_HEADER=$out/header.json
python3 - "$build/BUILD_ID" "$CUPOOL_RUN_HEADER" "$command_line" <<'PY'
import json, subprocess, sys, datetime, hashlib
build_id, path, command = sys.argv[1:4]
ident = dict(l.strip().split("=", 1) for l in open(build_id) if "=" in l)
def out(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout.strip()
    except Exception as e:  # noqa: BLE001 - a missing tool is reported as such
        return f"unavailable ({e.__class__.__name__})"
h = {"commit": ident.get("commit"), "built": ident.get("built"),
     "gpu": out(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).splitlines()[0],
     "cuda": out(["nvcc", "--version"]).splitlines()[-1],
     "torch": out([sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"]),
     "jax": out([sys.executable, "-c", "import jax; print(jax.__version__)"]),
     "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
     "command": command}
json.dump(h, open(path, "w"), indent=1)
for k, v in h.items():
    print(f"{k}: {v}")
PY
status=0
beside=()  # CUPOOL_GPU_SUITE_BESIDE_COMPAT=1 (the docs plan): the suite runs inside run_all.py, beside group compat
if [[ ${CUPOOL_GPU_SUITE_BESIDE_COMPAT:-0} == 1 && ,$groups, == *,suite,* && ,$groups, == *,compat,* ]]; then
  beside=(--suite-beside-compat "$carry/compat")
elif [[ $groups == all || ,$groups, == *,suite,* ]]; then
  python3 "$here/compat/run_compat.py" "$build" "$carry/compat" "$out" --jobs 8 || status=1
fi
if [[ $groups == all || ,$groups, == *,contextless,* ]]; then
  bash "$here/check_contextless.sh" "$build" "$carry/bin" "$out" || status=1
fi
rest=$(tr , '\n' <<<"$groups" | grep -vx suite | grep -vx contextless | paste -sd, -)
if [[ $groups == all ]]; then
  python3 "$here/run_all.py" "$build" "$carry/workloads" "$carry/bin" "$out" || status=1
elif [[ -n $rest ]]; then
  python3 "$here/run_all.py" "$build" "$carry/workloads" "$carry/bin" "$out" --only "$rest" ${beside[@]+"${beside[@]}"} || status=1
fi
if [[ -n $before ]]; then
  python3 "$here/compare_builds.py" "$before" "$build" "$carry/bin" "$out/compare" --rounds 3 || status=1
fi
echo "run_all.sh: $([[ $status == 0 ]] && echo 'every check passed' || echo 'SOME CHECKS FAILED')"
exit $status
