#!/usr/bin/env python3
"""docs_check.py on a small page and raw file (test/gpu/fixtures/docs_check): the page as it is
passes; changing a number, a ratio or a comparative word in it, in the claim or in the prose
around it, makes the check fail."""
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import docs_check  # noqa: E402

FIX = os.path.join(HERE, "fixtures", "docs_check")
RUNS = os.path.join(FIX, "docs", "gpu-runs")
RAW = json.load(open(os.path.join(RUNS, "2026-01-01-runT-results.json")))


def vmm_vs_growth():
    g, v = (statistics.median(RAW["steps"][p]) for p in ("growth", "vmm"))
    ratio = v / g
    rounds = sum(a > b for a, b in zip(RAW["steps"]["vmm"], RAW["steps"]["growth"]))
    word = "slower" if ratio > 1 else "faster"
    return (f"vmm's median step, {v} ms, was {ratio:.3f} times growth's {g} ms: {word}, in {rounds} of "
            f"{len(RAW['steps']['vmm'])} rounds")


def errors_of(text):
    errors = []
    new = docs_check.fill(text, "page.md", {}, {"vmm-vs-growth": vmm_vs_growth}, True, errors)
    docs_check.check_prose(new, "page.md", RUNS, True, errors)
    return errors


page = open(os.path.join(FIX, "page.md")).read()
failed = []
if errors_of(page):
    failed.append(f"the fixture page as it is: {errors_of(page)}")
for what, old, new in (("a number in the claim", "30.5 ms", "30.6 ms"),
                       ("a ratio in the claim", "1.050 times", "1.040 times"),
                       ("a comparative word in the claim", "slower", "faster"),
                       ("an 'x of y' in the claim", "3 of 3 rounds", "2 of 3 rounds"),
                       ("a number in the prose", "step was 29.06 ms", "step was 29.07 ms"),
                       ("a ratio typed in the prose", "step was 29.06 ms.", "step was 29.06 ms, 1.05 times vmm's."),
                       ("a comparative word typed in the prose", "step was 29.06 ms.", "step was 29.06 ms, faster.")):
    assert page.count(old) == 1, old
    if not errors_of(page.replace(old, new)):
        failed.append(f"changing {what} ('{old}' to '{new}') passed the check")


def library_check():
    """check_library in a small repository: a page quoting a run of HEAD's library passes; once
    policy/ changes it fails; in a shallow clone without the run's commit it is skipped, not passed."""
    import subprocess
    import tempfile
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "repo")
        os.makedirs(os.path.join(repo, "policy"))
        os.makedirs(os.path.join(repo, "docs", "gpu-runs"))

        def git(*a, cwd=repo):
            return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=cwd, check=True,
                                  capture_output=True, text=True).stdout.strip()
        git("init", "-q")
        open(os.path.join(repo, "policy", "pool.cpp"), "w").write("int a;\n")
        git("add", "-A")
        git("commit", "-qm", "a")
        built = git("rev-parse", "--short", "HEAD")
        json.dump({"header": {"commit": built}}, open(os.path.join(repo, "docs", "gpu-runs", "r.json"), "w"))
        open(os.path.join(repo, "page.md"), "w").write("See docs/gpu-runs/r.json.\n")
        git("add", "-A")
        git("commit", "-qm", "the run")

        def run_check(root):
            errors = []
            skipped = docs_check.check_library(root, ["page.md"], os.path.join(root, "docs", "gpu-runs"), errors)
            return errors, skipped
        if run_check(repo) != ([], None):
            out.append(f"a page quoting a run of HEAD's library: {run_check(repo)}")
        open(os.path.join(repo, "policy", "pool.cpp"), "w").write("int b;\n")
        git("commit", "-qam", "the library changes")
        errors, skipped = run_check(repo)
        if not errors or skipped:
            out.append(f"a page quoting a run of an older library passed: {errors} {skipped}")
        git("clone", "-q", "--depth", "1", "file://" + repo, os.path.join(tmp, "shallow"), cwd=tmp)
        errors, skipped = run_check(os.path.join(tmp, "shallow"))
        if errors or not skipped:
            out.append(f"a shallow clone without the run's commit: not skipped ({errors}, {skipped})")
    return out


failed += library_check()
for f in failed:
    print("FAIL:", f)
print("ok" if not failed else f"{len(failed)} failed")
sys.exit(1 if failed else 0)
