#!/usr/bin/env python3
"""docs_check.py on a small page and raw file (test/gpu/fixtures/docs_check): the page as it is
passes; changing a number, a ratio or a comparative word in it, in the claim or in the prose
around it, makes the check fail. Then the lag lines and the builds' names, in a small git
repository (lag_check)."""
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


def lag_check():
    """The lag lines and the builds in a small repository (docs_check.Lag, check_builds): (a) a page
    whose lag line is right passes; (b) a wrong count or file list fails; (c) a library commit after
    the line's commit does not fail; (d) a line as of a commit that is not an ancestor of HEAD fails;
    (e) in a shallow clone the lag line is skipped, not failed, and the table still checked; a raw
    file that names no build, or a -dirty one, fails."""
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

        def write(path, text, root=repo):
            open(os.path.join(root, path), "w").write(text)
        git("init", "-q")
        write("policy/pool.cpp", "int a;\n")
        git("add", "-A")
        git("commit", "-qm", "a")
        built = git("rev-parse", "--short", "HEAD")
        json.dump({"header": {"commit": built}, "step_ms": 29.06}, open(os.path.join(repo, "docs", "gpu-runs", "r.json"), "w"))
        write("policy/grow.cpp", "int g;\n")
        git("add", "-A")
        git("commit", "-qm", "the run, and a library change")

        def tables(root):
            def t():
                d = json.load(open(os.path.join(root, "docs", "gpu-runs", "r.json")))
                return f"Source: `docs/gpu-runs/r.json`: build `{d['header']['commit']}`.\n\n| step ms |\n|---|\n| {d['step_ms']} |"
            return {"t": t}

        def claims(root):
            return {"c": lambda: f"step {json.load(open(os.path.join(root, 'docs', 'gpu-runs', 'r.json')))['step_ms']} ms "
                                 "(docs/gpu-runs/r.json)"}

        def run(root, text, check=True, as_of=None):
            """(errors, skipped, the page as made)."""
            errors = []
            runs = os.path.join(root, "docs", "gpu-runs")
            lag = docs_check.Lag(root, runs, check, as_of)
            new = docs_check.fill(text, "page.md", tables(root), claims(root), check, errors, lag)
            write("page.md", text, root)
            skipped = docs_check.check_builds(root, ["page.md"], runs, errors) + lag.skipped
            return errors, skipped, new
        blank = "<!-- gpu:t:begin -->\n<!-- gpu:t:end -->\n\nSee <!-- claim:c -->x<!-- /claim -->.\n"
        _, _, page = run(repo, blank, check=False)
        line = f"as of `{git('rev-parse', '--short', 'HEAD')}`, the library (policy/, shim/, trace/) has changed in " \
               "1 commit since (files: policy/grow.cpp)."
        if line not in page or "as of" not in page.split("claim:c")[1]:
            out.append(f"the lag lines made: {page}")
        write("page.md", page)
        git("add", "-A")
        git("commit", "-qm", "the page")
        errors, skipped, _ = run(repo, page)
        if errors or skipped:
            out.append(f"(a) a page whose lag lines are right: {errors} {skipped}")
        for what, old, new in (("(b) a wrong count", "trace/) has changed in 1 commit", "trace/) has changed in 2 commits"),
                               ("(b) a wrong file", "(files: policy/grow.cpp)", "(files: policy/pool.cpp)"),
                               ("(b) a wrong file in the claim", "since: policy/grow.cpp)", "since: policy/pool.cpp)"),
                               ("(b) an 'unchanged'", "has changed in 1 commit since (files: policy/grow.cpp)",
                                "is unchanged since"),
                               ("a number in the table", "| 29.06 |", "| 29.07 |")):
            assert page.count(old) == 1, old
            if not run(repo, page.replace(old, new))[0]:
                out.append(f"{what} ('{old}' to '{new}') passed the check")
        if not run(repo, page.replace("29.06 ms (docs", "29.07 ms (docs"))[0]:
            out.append("a number in the claim passed the check")
        write("policy/pool.cpp", "int b;\n")
        write("page.md", page)
        git("commit", "-qam", "the library changes after the page's line")
        errors, skipped, _ = run(repo, page)
        if errors or skipped:
            out.append(f"(c) a library commit after the line's commit failed the check: {errors} {skipped}")
        write("page.md", page)
        git("checkout", "-qb", "side", "HEAD~1")
        write("policy/side.cpp", "int s;\n")
        git("add", "-A")
        git("commit", "-qm", "a commit HEAD will not have")
        side = git("rev-parse", "--short", "HEAD")
        git("checkout", "-q", "-")
        _, _, off = run(repo, page, check=False, as_of=side)  # right counts, as of a commit off HEAD's line
        errors, _, _ = run(repo, off)
        if not any("not HEAD nor an ancestor" in e for e in errors):
            out.append(f"(d) a lag line as of a commit that is not an ancestor of HEAD: {errors}")
        git("clone", "-q", "--depth", "1", "file://" + repo, os.path.join(tmp, "shallow"), cwd=tmp)
        shallow = os.path.join(tmp, "shallow")
        errors, skipped, _ = run(shallow, page)
        if errors or not skipped:
            out.append(f"(e) a shallow clone: the lag lines not skipped ({errors}, {skipped})")
        errors, skipped, _ = run(shallow, page.replace("trace/) has changed in 1 commit", "trace/) has changed in 2 commits"))
        if errors or not skipped:
            out.append(f"(e) a shallow clone: a lag line it cannot verify failed ({errors}, {skipped})")
        if not run(shallow, page.replace("| 29.06 |", "| 29.07 |"))[0]:
            out.append("(e) a shallow clone: a wrong number in the table passed")
        for header, why in (({}, "names no build"), ({"commit": built + "-dirty"}, "-dirty"),
                            ({"commit": "0123abc"}, "not a commit here")):
            json.dump({"header": header, "step_ms": 29.06}, open(os.path.join(repo, "docs", "gpu-runs", "r.json"), "w"))
            errors, _, _ = run(repo, "See docs/gpu-runs/r.json.\n")
            if not any(why in e for e in errors):
                out.append(f"a raw file whose build {why} passed: {errors}")
    return out


def docs_run_check():
    """docs_run.DocsRun finds each table's file by name, whatever the split: the four-part names of
    2026-12-03 and a later two-part run's; the newest wins per table; a table renders the rows its
    file has (a cut configuration is no row), and a missing file names the part that runs it."""
    import tempfile
    import docs_plan
    import docs_run
    out = []
    with tempfile.TemporaryDirectory() as runs:
        def put(name, d):
            json.dump(d, open(os.path.join(runs, name), "w"))
        head = {"commit": "abc1234", "gpu": "GPU, 1", "torch": "2 x", "jax": "0", "date": "d", "command": "c"}
        bench = '{"bytes": 512, "threads": 1, "median_ns": %s}'
        put("2026-12-03-docs2-header.json", head)
        put("2026-12-03-docs2-results-compat-inflight-rounds-share.json", {"runs": [
            {"name": f"round{i}-{c}", "stdout": bench % 5} for i in (1, 2, 3) for c in ("driver", "growth-sync-trace-on")]})
        put("2026-12-03-docs3-header.json", head)
        put("2026-12-03-docs3-defaultpolicy.json", {})
        put("2026-12-10-docs2-header.json", dict(head, date="new"))
        put("2026-12-10-docs2-results-rounds-sharing-steps.json", {"runs": [
            {"name": f"round{i}-driver", "stdout": bench % i} for i in (1, 2, 3)] + [
            {"name": f"step-round{i}-torch-nocache-nocupool", "stdout": "step=1.5 ms loss_hex=0x1p-1"} for i in (1, 2, 3)]})
        put("2026-12-10-docs1-header.json", dict(head, date="new"))
        put("2026-12-10-docs1-results-compat-defaultpolicy-policies.json", {"runs": []})
        put("2026-12-08-decision-header.json", head)
        put("2026-12-08-decision-defaultpolicy.json", {})
        run, tables, claims = docs_run.make(runs)
        want = {"rounds": "2026-12-10-docs2-results-rounds-sharing-steps.json",
                "steps": "2026-12-10-docs2-results-rounds-sharing-steps.json",
                "compat": "2026-12-10-docs1-results-compat-defaultpolicy-policies.json",
                "sharing": "2026-12-10-docs2-results-rounds-sharing-steps.json", "memviz": None}
        for group, name in want.items():
            at = run.results(group)
            if (at and run.name(at)) != name:
                out.append(f"DocsRun.results({group!r}): {at}, not {name}")
        if run.name(run.find("defaultpolicy.json")) != "2026-12-08-decision-defaultpolicy.json":
            out.append(f"DocsRun.find('defaultpolicy.json'): {run.find('defaultpolicy.json')}")
        pair = tables["docs-pair-cost"]()
        if "2026-12-10-docs2" not in pair or "growth-sync-trace-on" in pair or "| driver | 512 B | 1 | 1 / 2 / 3 | 3 |" not in pair:
            out.append(f"the pair-cost table of the newest run, its rows only: {pair}")
        steps = tables["docs-steps"]()
        if steps.count("\n| torch-") != 1 or "| 1.5 / 1.5 / 1.5 |" not in steps:
            out.append(f"the steps table of the newest run, its rows only: {steps}")
        part = next(k for k, p in zip(docs_plan.PART_NUMBERS, docs_plan.PARTS) if "sharing" in p["groups"])
        if f"--part {part}/{len(docs_plan.PARTS)}" not in tables["docs-sharing"]():
            out.append(f"a missing sharing.json: {tables['docs-sharing']()}")
    return out


failed += lag_check()
failed += docs_run_check()
for f in failed:
    print("FAIL:", f)
print("ok" if not failed else f"{len(failed)} failed")
sys.exit(1 if failed else 0)
