"""The checks of the measured pages (README.md, docs/compatibility.md, docs/performance.md,
docs/policies.md) against the raw GPU results in docs/gpu-runs/, used by docs_tables.py and by its
unit test (test/gpu/test_docs_check.py). Three kinds of generated or checked text:

- a table, `<!-- gpu:NAME:begin -->` ... `<!-- gpu:NAME:end -->`: what TABLES[NAME]() makes;
- a claim, inline, `<!-- claim:NAME -->` ... `<!-- /claim -->`: a sentence with numbers, ratios and
  comparative words ("twice", "within 1%", "faster", "N times", "x of y"), what CLAIMS[NAME]()
  makes of its raw file; a claim written by hand, or changed by one word, fails;
- the prose around them: every measured number (a time, size, ratio or share) must be written in
  a raw file that its own paragraph cites (`docs/gpu-runs/FILE`), and a comparative word or a
  ratio outside a claim fails in a paragraph that cites a raw file or carries a measured number:
  comparisons are generated, not typed.

Every raw file a page cites must name its build, a commit of this repository (check_builds); a
build marked -dirty is refused, since what it held is not known. The library (policy/, shim/,
trace/) may have moved since that build: each table, and each claim, ends with a generated line
(Lag) that names the build and says how far the library has moved since, as of a commit Y:

  Measured on `X`; as of `Y`, the library (policy/, shim/, trace/) is unchanged since.
  Measured on `X`; as of `Y`, the library (policy/, shim/, trace/) has changed in N commits since (files: A, B, and K more).

(a claim ends with the same words in parentheses: " (measured on `X`; as of `Y`, the library has
changed in N commits since: A, B)"). Y is HEAD when
docs_tables.py ROOT rewrites the pages; the check recomputes the line with the Y the page names, so
a library commit after Y never fails it, and requires Y to be HEAD or an ancestor of HEAD. Where
the history is not there (a shallow clone, no git), only the lag lines and the builds' commits are
left unchecked, and said so. report() prints, per page and raw file, its build and how far HEAD's
library has moved since (docs_tables.py ROOT --check-library).
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


def fill(text, page, tables, claims, check, errors, lag=None):
    """The page with every table and claim regenerated; a difference is an error when checking.
    With lag (a Lag), each table and claim also carries its lag line (checked apart from it)."""
    def table(m):
        name = m.group(2)
        if name not in tables:
            errors.append(f"{page}: unknown table {name}")
            return m.group(0)
        made = tables[name]() + "\n"
        old = LAG_TABLE.sub("", m.group(3)) if lag else m.group(3)
        if check and old != made:
            errors.append(f"{page}: table {name} is not what docs/gpu-runs says (run test/gpu/docs_tables.py ROOT)")
        tail = lag.lines(page, f"table {name}", made, m.group(3), errors) if lag else ""
        return m.group(1) + made + tail + m.group(4)

    def claim(m):
        name = m.group(2)
        if name not in claims:
            errors.append(f"{page}: unknown claim {name}")
            return m.group(0)
        made = claims[name]()
        old = LAG_CLAIM.sub("", m.group(3)) if lag else m.group(3)
        if check and old != made:
            errors.append(f"{page}: claim {name} says '{old}', its raw file says '{made}' "
                          "(run test/gpu/docs_tables.py ROOT)")
        tail = lag.lines(page, f"claim {name}", made, m.group(3), errors, short=True) if lag else ""
        return m.group(1) + made + tail + m.group(4)

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


def git(root, *args):
    """(exit status, stdout, stderr) of a git command in root; 128 where git cannot run."""
    try:
        p = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
    except OSError as e:
        return 128, "", str(e)
    return p.returncode, p.stdout.strip(), p.stderr.strip()


def is_commit(root, name):
    return git(root, "cat-file", "-e", f"{name}^{{commit}}")[0] == 0


def moved(root, build, as_of):
    """How far the library moved from build to as_of: (commits, files that differ), or None where
    git cannot say (either commit is not here)."""
    rc, log, _ = git(root, "log", "--oneline", f"{build}..{as_of}", "--", *LIBRARY)
    rc2, files, _ = git(root, "diff", "--name-only", build, as_of, "--", *LIBRARY)
    if rc or rc2:
        return None
    return len(log.splitlines()), files.splitlines()


MAX_FILES = 8


def state(build, commits, files, short=False):
    """What the library did since build, in words (the end of a lag line; short: no parentheses)."""
    n = f"{commits} commit{'' if commits == 1 else 's'}"
    if files:
        shown = ", ".join(files[:MAX_FILES]) + (f", and {len(files) - MAX_FILES} more" if len(files) > MAX_FILES else "")
        return f"has changed in {n} since" + (f": {shown}" if short else f" (files: {shown})")
    if commits:
        return f"is unchanged since: {n} touched it, and no file differs from `{build}`'s"
    return "is unchanged since"


def lag_line(build, as_of, commits, files, short=False):
    """A table's lag line (its own paragraph, after the table), or a claim's (a parenthesis)."""
    if short:
        return f" (measured on `{build}`; as of `{as_of}`, the library {state(build, commits, files, short)})"
    return (f"\nMeasured on `{build}`; as of `{as_of}`, the library ({', '.join(l + '/' for l in LIBRARY)}) "
            f"{state(build, commits, files)}.\n")


LAG_TABLE = re.compile(r"\nMeasured on `([^`]+)`; as of `([^`]+)`, the library [^\n]*\n")
LAG_CLAIM = re.compile(r" \(measured on `([^`]+)`; as of `([^`]+)`, the library [^()]*\)")


def builds_of(runs_dir, text):
    """The builds of the raw files text cites, in order, each once (None: a file that names none)."""
    out = []
    for f in CITED.findall(text):
        if f != "README.md" and os.path.isfile(os.path.join(runs_dir, f)):
            b = header_commit(runs_dir, f)
            if b not in out:
                out.append(b)
    return out


class Lag:
    """The lag lines of the tables and claims. Rewriting (check=False), a line is made as of HEAD (or
    as_of); checking, as of the commit the page's own line names, which must be HEAD or an ancestor of
    it. Where the history is missing, the page's line is kept as it is, and skipped names why."""

    def __init__(self, root, runs_dir, check, as_of=None):
        self.root, self.runs_dir, self.check = root, runs_dir, check
        self.missing = history_missing(root)
        self.head = None if self.missing else (as_of or git(root, "rev-parse", "--short", "HEAD")[1] or None)
        self.skipped = []
        self.ancestor = {}

    def is_ancestor(self, y):
        if y not in self.ancestor:
            rc, _, err = git(self.root, "merge-base", "--is-ancestor", y, "HEAD")
            self.ancestor[y] = rc == 0
        return self.ancestor[y]

    def lines(self, page, what, made, old, errors, short=False):
        written = {}  # build -> (as of, the page's line)
        for m in (LAG_CLAIM if short else LAG_TABLE).finditer(old):
            written.setdefault(m.group(1), (m.group(2), m.group(0)))
        out = ""
        for build in builds_of(self.runs_dir, made):
            if not build or build.endswith("-dirty"):
                continue  # check_builds refuses it
            as_of, line = written.get(build, (None, None))
            if self.missing:
                self.skipped.append(f"{page}: {what}: the lag line of build {build} is not checked: {self.missing}")
                out += line or ""
                continue
            if self.check:
                if not as_of:
                    errors.append(f"{page}: {what} has no line saying how far the library has moved since build "
                                  f"{build} (run test/gpu/docs_tables.py ROOT)")
                    continue
                if not is_commit(self.root, as_of):
                    errors.append(f"{page}: {what}: its lag line is as of `{as_of}`, not a commit here")
                    out += line
                    continue
                if not self.is_ancestor(as_of):
                    errors.append(f"{page}: {what}: its lag line is as of `{as_of}`, which is not HEAD nor an "
                                  "ancestor of HEAD (run test/gpu/docs_tables.py ROOT)")
                    out += line
                    continue
            else:
                as_of = self.head
            if not is_commit(self.root, build):
                out += line or ""  # check_builds refuses it
                continue
            m = moved(self.root, build, as_of)
            if m is None:
                if self.check:
                    errors.append(f"{page}: {what}: git cannot say how far the library moved from `{build}` "
                                  f"to `{as_of}`")
                out += line or ""
                continue
            made_line = lag_line(build, as_of, *m, short=short)
            if self.check and line != made_line:
                errors.append(f"{page}: {what} says '{line.strip()}', git says '{made_line.strip()}' "
                              "(run test/gpu/docs_tables.py ROOT)")
            out += made_line
        return out


def cited_files(root, pages, runs_dir):
    """(page, raw file) for every raw file a page cites, in order."""
    for page in pages:
        text = open(os.path.join(root, page)).read()
        for f in sorted(set(CITED.findall(text))):
            if f != "README.md" and os.path.isfile(os.path.join(runs_dir, f)):
                yield page, f


def check_builds(root, pages, runs_dir, errors):
    """Every raw file a page cites names its build, a commit here, not -dirty. Returns what could
    not be checked (the history is missing) as lines to print."""
    missing = history_missing(root)
    skipped, seen = [], {}
    for page, f in cited_files(root, pages, runs_dir):
        commit = header_commit(runs_dir, f)
        if commit not in seen:
            seen[commit] = None
            if not commit:
                seen[commit] = "names no build"
            elif commit.endswith("-dirty"):
                seen[commit] = "was built from a tree with uncommitted changes (-dirty): its library is not known"
            elif missing:
                skipped.append(f"build {commit} is not looked up: {missing}")
            elif not is_commit(root, commit):
                seen[commit] = f"names build {commit}, not a commit here"
        if seen[commit]:
            errors.append(f"{page}: quotes docs/gpu-runs/{f}, which {seen[commit]}; every raw file a measured page "
                          "quotes names the commit it was built from")
    return skipped


def report(root, pages, runs_dir):
    """Per page and raw file: its build, and how far HEAD's library has moved since (lines to print)."""
    missing = history_missing(root)
    head = None if missing else git(root, "rev-parse", "--short", "HEAD")[1]
    out = [f"as of HEAD `{head}`" if head else f"no history to compare with: {missing}"]
    for page, f in cited_files(root, pages, runs_dir):
        build = header_commit(runs_dir, f)
        if not build:
            how = "names no build"
        elif build.endswith("-dirty"):
            how = f"build {build}: built from a tree with uncommitted changes, its library is not known"
        elif missing:
            how = f"build {build}"
        else:
            m = moved(root, build, "HEAD") if is_commit(root, build) else None
            how = f"build {build}: " + (f"the library {state(build, *m)}" if m else "not a commit here")
        out.append(f"{page}: docs/gpu-runs/{f}: {how}")
    return out
