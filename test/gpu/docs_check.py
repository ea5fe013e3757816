"""The checks of the measured pages (README.md, docs/compatibility.md, docs/performance.md,
docs/policies.md) against the raw GPU results in docs/gpu-runs/, used by docs_tables.py and by its
unit test (test/gpu/test_docs_check.py). Three kinds of generated or checked text:

- a table, `<!-- gpu:NAME:begin -->` ... `<!-- gpu:NAME:end -->`: what TABLES[NAME]() makes;
- a claim, inline, `<!-- claim:NAME -->` ... `<!-- /claim -->`: a sentence with numbers, ratios and
  comparative words ("twice", "within 1%", "faster", "N times", "x of y"), what CLAIMS[NAME]()
  makes of its raw file; a claim written by hand, or changed by one word, fails;
- the prose around them: every measured number (a time, size, ratio or share) must be written in
  a raw file that its own paragraph cites (`docs/gpu-runs/FILE`), or in a table of the page.
  With strict=True (docs_tables.py --check-library) the page's own tables no longer suffice, and a
  comparative word or a ratio outside a claim fails in a paragraph that cites a raw file or
  carries a measured number: comparisons are generated, not typed.

check_library: a measured page may quote only raw files whose build's library folders (policy/,
shim/, trace/) are HEAD's (`git diff --quiet COMMIT HEAD -- policy shim trace`); a build marked
-dirty is refused, since what it held is not known. Where the history to compare with is not
there (a shallow clone without the build's commit, no git), the check is skipped, not passed.
"""
import json
import os
import re
import subprocess
from decimal import Decimal, InvalidOperation

BLOCK = re.compile(r"(<!-- gpu:([a-z0-9-]+):begin -->\n)(.*?)(<!-- gpu:\2:end -->)", re.S)
CLAIM = re.compile(r"(<!-- claim:([a-z0-9.-]+) -->)(.*?)(<!-- /claim -->)", re.S)
# A measured number: a value with a unit of time, size, or a ratio or share.
NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(ms|us|µs|ns|s\b|MiB|GiB|KiB|MB|GB|%|x\b|times\b)")
# Comparisons that need data behind them.
COMPARATIVE = re.compile(
    r"\b(twice|thrice|half as|\d+(?:\.\d+)? times|\d+(?:\.\d+)?x\b|within \d+(?:\.\d+)?\s?%|faster|slower|"
    r"cheaper|dearer|\d+ of \d+|\d+/\d+|more than|less than|fewer than|as fast as|as much as|the same speed)", re.I)
CITED = re.compile(r"docs/gpu-runs/([\w.-]*\w)")
LIBRARY = ("policy", "shim", "trace")


def values(text):
    return {Decimal(t) for t in re.findall(r"\d+(?:\.\d+)?", text)}


def _value(s):
    try:
        return Decimal(s)
    except InvalidOperation:
        return None


def fill(text, page, tables, claims, check, errors):
    """The page with every table and claim regenerated; a difference is an error when checking."""
    def table(m):
        name = m.group(2)
        if name not in tables:
            errors.append(f"{page}: unknown table {name}")
            return m.group(0)
        made = tables[name]() + "\n"
        if check and m.group(3) != made:
            errors.append(f"{page}: table {name} is not what docs/gpu-runs says (run test/gpu/docs_tables.py ROOT)")
        return m.group(1) + made + m.group(4)

    def claim(m):
        name = m.group(2)
        if name not in claims:
            errors.append(f"{page}: unknown claim {name}")
            return m.group(0)
        made = claims[name]()
        if check and m.group(3) != made:
            errors.append(f"{page}: claim {name} says '{m.group(3)}', its raw file says '{made}' "
                          "(run test/gpu/docs_tables.py ROOT)")
        return m.group(1) + made + m.group(4)

    return CLAIM.sub(claim, BLOCK.sub(table, text))


def check_prose(text, page, runs_dir, strict, errors):
    """The numbers (and, strict, the comparisons) of the prose outside tables and claims."""
    inside = " ".join(m.group(3) for m in BLOCK.finditer(text))
    outside = CLAIM.sub(" ", BLOCK.sub("", text))
    # Numbers in the options table and in code are not measurements.
    outside = re.sub(r"<!-- options:begin -->.*?<!-- options:end -->", "", outside, flags=re.S)
    outside = re.sub(r"```.*?```", "", outside, flags=re.S)
    # Code spans hold names, options and commands, not measurements; a results file named in one
    # stays visible to the paragraph.
    outside = re.sub(r"`([^`]*)`", lambda m: m.group(1) if "docs/gpu-runs/" in m.group(1) else "", outside)
    for para in re.split(r"\n\s*\n", outside):
        cited = [f for f in CITED.findall(para) if os.path.isfile(os.path.join(runs_dir, f))]
        named = "".join(open(os.path.join(runs_dir, f), errors="replace").read() for f in cited)
        known = values(named)
        numbers = list(NUMBER.finditer(para))
        for m in numbers:
            v = _value(m.group(1))
            if v in known or m.group(1) in named:
                continue
            if not strict and m.group(1) in inside:
                continue
            errors.append(f"{page}: '{m.group(0)}' is in no raw file its paragraph cites"
                          + ("" if strict else ", nor in a table of the page"))
        if strict and (cited or numbers):
            for m in COMPARATIVE.finditer(para):
                errors.append(f"{page}: '{m.group(0)}' compares measurements outside a generated claim "
                              f"(<!-- claim:NAME -->, docs_tables.py CLAIMS): '{' '.join(para.split())[:120]}'")


def header_commit(runs_dir, name):
    """The commit of the build a raw file names: its JSON header, its run's *-header.json, or its
    first lines (commit: X, commit=X, build `X`)."""
    path = os.path.join(runs_dir, name)
    if name.endswith(".json"):
        try:
            d = json.load(open(path))
            h = d.get("header") if isinstance(d, dict) else None
            if isinstance(h, dict) and h.get("commit"):
                return h["commit"]
            if isinstance(h, dict) and h.get("builds"):  # compare_builds.py: the build after
                return h["builds"].get("after", {}).get("commit")
        except (ValueError, OSError):
            pass
    head = open(path, errors="replace").read(4000)
    m = re.search(r"(?m)^(?:[-# ]*)commit[:=]\s*(\S+)", head)
    if m:
        return m.group(1)
    m = re.match(r"(\d{4}-\d\d-\d\d-run[A-Za-z0-9]+)-", name) or re.match(r"(\d{4}-\d\d-\d\d-docs\d+)-", name)
    if m and os.path.isfile(os.path.join(runs_dir, m.group(1) + "-header.json")):
        return json.load(open(os.path.join(runs_dir, m.group(1) + "-header.json"))).get("commit")
    return None


def history_missing(root):
    """Why the builds' commits may not be here to compare (no git, not a repository, a shallow
    clone), or None."""
    try:
        p = subprocess.run(["git", "-C", root, "rev-parse", "--is-shallow-repository"], capture_output=True, text=True)
    except OSError:
        return "git is not installed"
    if p.returncode != 0:
        return "the source tree is not a git repository"
    return "the clone is shallow" if p.stdout.strip() == "true" else None


def check_library(root, pages, runs_dir, errors):
    """Every raw file a measured page cites was made by a build whose library is HEAD's. Returns
    a reason to skip (the history needed is not here) when that is all that stops the check."""
    skipped = None
    seen = {}
    for page in pages:
        text = open(os.path.join(root, page)).read()
        for f in sorted(set(CITED.findall(text))):
            if f == "README.md" or not os.path.isfile(os.path.join(runs_dir, f)):
                continue
            commit = header_commit(runs_dir, f)
            if commit not in seen:
                if not commit:
                    seen[commit] = "names no build"
                elif commit.endswith("-dirty"):
                    seen[commit] = "was built from a tree with uncommitted changes (-dirty): its library is not known"
                else:
                    try:
                        p = subprocess.run(["git", "-C", root, "diff", "--quiet", commit, "HEAD", "--", *LIBRARY],
                                           capture_output=True, text=True)
                        rc, err = p.returncode, p.stderr
                    except OSError as e:
                        rc, err = 128, str(e)
                    why = history_missing(root) if rc > 1 else None
                    if why:
                        seen[commit] = None
                        skipped = f"build {commit} cannot be compared with HEAD: {why}"
                        continue
                    seen[commit] = None if rc == 0 else (
                        f"was made by build {commit}, whose {'/, '.join(LIBRARY)}/ differ from HEAD's" if rc == 1
                        else f"names build {commit}, not a commit here ({err.strip()[:100]})")
            if seen[commit]:
                errors.append(f"{page}: quotes docs/gpu-runs/{f}, which {seen[commit]}; the measured pages quote "
                              "only runs of HEAD's library (older figures go to docs/design.md, labelled with their build)")
    return skipped
