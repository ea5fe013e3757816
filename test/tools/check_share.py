#!/usr/bin/env python3
"""cupool top and cupool metrics on real shared budgets (test 'tools-share', test/tools/meson.build).

  check_share.py --cupool PATH --member PATH

PATH of --member is share_member (test/tools/share_member.cpp): a member of a budget, joined
through policy/shared_budget with figures chosen here. Two members of a budget with a random name
(parallel runs do not meet) hold known bytes; then:
  - top --json: the budget (limit, per device the budget, percent ones unresolved, and the sum
    held) and each member (pid, command, alive, out-of-memory count, per device held / in use /
    reserved / waiting) to the byte; top text; top with standard output a pipe prints once;
  - metrics: the exposition is well formed (HELP and TYPE before each family's samples, families
    not split), and the lines of the budget are exactly the expected ones, label values escaped;
  - metrics --textfile --once: the file holds the same metrics, was replaced by a rename (a new
    inode, no temporary file left), mode 0644 under umask 022; --textfile every interval until
    SIGTERM (exit 0); a directory that does not exist: exit 4;
  - metrics --listen 127.0.0.1:0: /metrics served with the exposition's content type and the same
    lines, 404 for other paths, 405 for POST; SIGTERM ends it with 0; a port in use: exit 4;
  - a member killed (SIGKILL) is shown gone (alive false, cupool_member_up 0), its bytes still held;
  - top on a terminal (a pty): redrawn (cursor home) more than once, SIGINT ends it with 0;
  - segments written by hand in a directory of their own (--dir, layout from share_member
    --layout): a command with a newline, a quote, a backslash, a byte that is not UTF-8 and an
    escape sequence (escaped in metrics, U+FFFD in JSON, no escape reaches the terminal); a pid
    reused while its earlier process's slot is still there (one series per pid and command);
    files that are not budgets (too small, another magic, never set up, a symbolic link) skipped
    with a warning naming each, counted in cupool_share_segments_unreadable;
  - usage errors (exit 2), --help, and standard output that cannot be written (exit 4).
Nothing here waits on a clock but generous timeouts for processes to start.
"""
import argparse
import fcntl
import json
import os
import pty
import re
import secrets
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

failures = []
TIMEOUT = 120  # seconds: only a bound for a process that never comes up
MiB = 1 << 20
GiB = 1 << 30


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what, file=sys.stderr)
    return cond


def read_until(fd, done, timeout=TIMEOUT):
    """Bytes read from `fd` until done(data) or EOF; the timeout only bounds a process that hangs."""
    data = b""
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while not done(data):
        left = deadline - time.monotonic()
        if left <= 0 or not sel.select(left):
            break
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # a pty whose other side closed
            break
        if not chunk:
            break
        data += chunk
    sel.close()
    return data


class Run:
    def __init__(self, opts):
        self.opts = opts

    def __call__(self, *args, rc=None, **kw):
        kw.setdefault("stdout", subprocess.PIPE)
        p = subprocess.run([self.opts.cupool, *args], stderr=subprocess.PIPE, text=True, errors="replace",
                           timeout=TIMEOUT, **kw)
        if rc is not None:
            check(p.returncode == rc, f"cupool {' '.join(args)}: exit {p.returncode}, expected {rc}\n{p.stderr}")
        return p


def start_member(opts, name, limit, *args):
    p = subprocess.Popen([opts.member, name, limit, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = read_until(p.stdout.fileno(), lambda d: b"\n" in d)
    if not check(line == b"ready\n", f"share_member {' '.join(args)}: {line!r} {p.stderr.read() if p.poll() is not None else b''!r}"):
        p.kill()
        p.wait()
        sys.exit(1)
    return p


def parse_exposition(text, what):
    """Checks the text exposition format's rules; returns {family: type} and the sample lines."""
    types, samples, done, current = {}, [], set(), None
    helped = set()
    sample_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\\n])*",?)*\})? (\S+)$')
    check(text.endswith("\n"), f"{what}: does not end with a newline")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            check(name not in helped, f"{what}: HELP twice for {name}")
            helped.add(name)
            continue
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ")
            check(name in helped, f"{what}: TYPE of {name} without HELP")
            check(name not in types, f"{what}: TYPE twice for {name}")
            check(typ in ("gauge", "counter"), f"{what}: type {typ}")
            if current is not None:
                done.add(current)
            types[name], current = typ, name
            continue
        m = sample_re.match(line)
        if not check(m is not None, f"{what}: not a sample line: {line!r}"):
            continue
        name = m.group(1)
        check(name == current and name not in done, f"{what}: {name} sample outside its family: {line!r}")
        check(not name.endswith("_total") or types.get(name) == "counter", f"{what}: {name} is not a counter")
        float(m.group(5))
        samples.append(line)
    return types, samples


FAMILIES = {
    "cupool_share_budget_bytes": "gauge", "cupool_share_budget_ratio": "gauge", "cupool_share_held_bytes": "gauge",
    "cupool_share_members": "gauge", "cupool_share_gone_members": "gauge", "cupool_member_up": "gauge",
    "cupool_member_held_bytes": "gauge",
    "cupool_member_in_use_bytes": "gauge", "cupool_member_reserved_bytes": "gauge",
    "cupool_member_waiting_bytes": "gauge", "cupool_member_out_of_memory_total": "counter",
    "cupool_share_segments_unreadable": "gauge",
}


def budget_lines(text, name, what):
    types, samples = parse_exposition(text, what)
    check(types == FAMILIES, f"{what}: families {types}")
    return [s for s in samples if f'share="{name}"' in s]


def find_budget(doc, name):
    found = [b for b in doc["budgets"] if b["name"] == name]
    check(len(found) == 1, f"budget {name}: found {len(found)} times in {doc}")
    return found[0] if found else None


def expected_metrics(name, owner, a, b, a_gone=False):
    """The budget's lines; with `a_gone`, a was killed: it drops out, counted apart (issue 26)."""
    s = f'share="{name}",owner="{owner}"'
    ma = f'{s},pid="{a}",command="share_member"'
    mb = f'{s},pid="{b}",command="we\\"ird\\\\name"'
    lines = [
        f'cupool_share_budget_bytes{{{s},device="0"}} {64 * MiB}',
        f'cupool_share_budget_ratio{{{s},device="1"}} 0.5',
        f'cupool_share_held_bytes{{{s},device="0"}} {48 * MiB}',
        f'cupool_share_held_bytes{{{s},device="1"}} {100 * MiB}',
        f'cupool_share_members{{{s}}} {1 if a_gone else 2}',
        f'cupool_share_gone_members{{{s}}} {1 if a_gone else 0}',
        f'cupool_member_up{{{ma}}} 1',
        f'cupool_member_up{{{mb}}} 1',
        f'cupool_member_held_bytes{{{ma},device="0"}} {16 * MiB}',
        f'cupool_member_held_bytes{{{ma},device="1"}} {100 * MiB}',
        f'cupool_member_held_bytes{{{mb},device="0"}} {32 * MiB}',
        f'cupool_member_in_use_bytes{{{ma},device="0"}} {10 * MiB}',
        f'cupool_member_in_use_bytes{{{ma},device="1"}} 0',
        f'cupool_member_in_use_bytes{{{mb},device="0"}} {32 * MiB}',
        f'cupool_member_reserved_bytes{{{ma},device="0"}} {16 * MiB}',
        f'cupool_member_reserved_bytes{{{ma},device="1"}} {100 * MiB}',
        f'cupool_member_reserved_bytes{{{mb},device="0"}} {32 * MiB}',
        f'cupool_member_waiting_bytes{{{ma},device="0"}} 0',
        f'cupool_member_waiting_bytes{{{ma},device="1"}} 0',
        f'cupool_member_waiting_bytes{{{mb},device="0"}} 0',
        f'cupool_member_out_of_memory_total{{{ma}}} 0',
        f'cupool_member_out_of_memory_total{{{mb}}} 1',
    ]
    return [line for line in lines if not (a_gone and ma + "}" in line or a_gone and ma + "," in line)]


def check_real_budget(opts, run, name, owner, segment):
    a = start_member(opts, name, "0:64MiB,1:50%", "--admit", f"0:{GiB}:{16 * MiB}:{10 * MiB}:{16 * MiB}",
                     "--admit", f"1:{GiB}:{100 * MiB}:0:{100 * MiB}")
    b = start_member(opts, name, "0:64MiB,1:50%", "--comm", 'we"ird\\name',
                     "--admit", f"0:{GiB}:{32 * MiB}:{32 * MiB}:{32 * MiB}", "--refuse", f"0:{GiB}:{32 * MiB}")
    members = [a, b]
    try:
        check(os.path.exists(segment), f"{segment} was not created")
        member_a = {"pid": a.pid, "command": "share_member", "alive": True, "ooms": 0, "devices": [
            {"device": 0, "held_bytes": 16 * MiB, "in_use_bytes": 10 * MiB, "reserved_bytes": 16 * MiB, "waiting_bytes": 0},
            {"device": 1, "held_bytes": 100 * MiB, "in_use_bytes": 0, "reserved_bytes": 100 * MiB, "waiting_bytes": 0}]}
        member_b = {"pid": b.pid, "command": 'we"ird\\name', "alive": True, "ooms": 1, "devices": [
            {"device": 0, "held_bytes": 32 * MiB, "in_use_bytes": 32 * MiB, "reserved_bytes": 32 * MiB, "waiting_bytes": 0}]}
        expected = {"name": name, "owner": owner, "limit": "0:64MiB,1:50%", "segment": segment,
                    "devices": [{"device": 0, "budget": "64MiB", "budget_bytes": 64 * MiB, "held_bytes": 48 * MiB,
                                 "held_by_gone_bytes": 0},
                                {"device": 1, "budget": "50%", "budget_bytes": None, "held_bytes": 100 * MiB,
                                 "held_by_gone_bytes": 0}],
                    "members": sorted([member_a, member_b], key=lambda m: m["pid"]), "gone_members": 0}

        # top --json, once; and without --once, standard output a pipe: once too.
        for args in (["top", "--json", "--once"], ["top", "--json"]):
            p = run(*args, rc=0)
            doc = json.loads(p.stdout)
            check(doc.get("format") == "cupool-top" and doc.get("version") == 1, f"{args}: header {p.stdout[:200]}")
            got = find_budget(doc, name)
            check(got == expected, f"{args}: budget\n{json.dumps(got, indent=1)}\nexpected\n{json.dumps(expected, indent=1)}")
        p = run("top", rc=0)
        check(p.stdout.startswith("cupool top: ") and "\x1b" not in p.stdout, f"top to a pipe: {p.stdout[:200]!r}")
        for text in (f"budget {name}", "limit 0:64MiB,1:50%", "64.0 MiB", "48.0 MiB", "75.0%", "50% of device",
                     f"{a.pid}  share_member", f'{b.pid}  we"ird\\name', "alive"):
            check(text in p.stdout, f"top text lacks {text!r}:\n{p.stdout}")

        # metrics to standard output.
        want = expected_metrics(name, owner, a.pid, b.pid)
        p = run("metrics", rc=0)
        got = budget_lines(p.stdout, name, "metrics")
        check(got == want, "metrics lines:\n" + "\n".join(got) + "\nexpected:\n" + "\n".join(want))
        p = run("metrics", "--once", rc=0)
        check(budget_lines(p.stdout, name, "metrics --once") == want, "metrics --once differs")

        check_textfile(opts, run, name, want)
        check_listen(opts, run, name, want)
        check_live_top(opts, name)

        # A member killed holding memory: it drops out of the views (issue 26), its bytes still
        # held, counted apart, until a member that needs room empties its slot.
        a.kill()
        a.wait()
        p = run("top", "--json", "--once", rc=0)
        got = find_budget(json.loads(p.stdout), name)
        gone = dict(expected, members=[member_b], gone_members=1,
                    devices=[dict(expected["devices"][0], held_by_gone_bytes=16 * MiB),
                             dict(expected["devices"][1], held_by_gone_bytes=100 * MiB)])
        check(got == gone, f"after SIGKILL: {json.dumps(got, indent=1)}")
        p = run("metrics", rc=0)
        want_gone = expected_metrics(name, owner, a.pid, b.pid, a_gone=True)
        got = budget_lines(p.stdout, name, "metrics after SIGKILL")
        check(got == want_gone, "metrics after SIGKILL:\n" + "\n".join(got))
        p = run("top", "--once", rc=0)
        check(f"{a.pid}  share_member" not in p.stdout and "1 member gone, holding 116.0 MiB" in p.stdout,
              f"top text after SIGKILL:\n{p.stdout}")
    finally:
        for m in members:
            if m.poll() is None:
                m.kill()
            m.wait()


def check_textfile(opts, run, name, want):
    with tempfile.TemporaryDirectory() as d:
        prom = os.path.join(d, "cupool.prom")
        with open(prom, "w") as f:
            f.write("previous\n")
        before = os.stat(prom).st_ino
        old = os.umask(0o022)
        try:
            run("metrics", "--textfile", prom, "--once", rc=0)
        finally:
            os.umask(old)
        text = open(prom).read()
        check(budget_lines(text, name, "--textfile") == want, "--textfile lines differ:\n" + text)
        check(os.stat(prom).st_ino != before, "--textfile was written in place, not renamed over")
        check(os.listdir(d) == ["cupool.prom"], f"--textfile left files behind: {os.listdir(d)}")
        mode = stat.S_IMODE(os.stat(prom).st_mode)
        check(mode == 0o644, f"--textfile mode {mode:o}, expected 644 (node_exporter reads it as another user)")

        # Every interval until SIGTERM.
        loop = os.path.join(d, "loop.prom")
        p = subprocess.Popen([opts.cupool, "metrics", "--textfile", loop, "--interval", "20ms"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + TIMEOUT
        while not os.path.exists(loop) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=TIMEOUT)
        check(p.returncode == 0, f"metrics --textfile (loop), SIGTERM: exit {p.returncode}: {err!r}")
        check(os.path.exists(loop) and budget_lines(open(loop).read(), name, "--textfile loop") == want,
              "metrics --textfile (loop): file missing or different")
        check(sorted(os.listdir(d)) == ["cupool.prom", "loop.prom"], f"--textfile loop left files: {os.listdir(d)}")

        p = run("metrics", "--textfile", os.path.join(d, "no", "such", "dir.prom"), "--once", rc=4)
        check("dir.prom" in p.stderr, f"--textfile in a missing directory: {p.stderr}")


def check_listen(opts, run, name, want):
    p = subprocess.Popen([opts.cupool, "metrics", "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        line = read_until(p.stderr.fileno(), lambda d: b"\n" in d).decode()
        m = re.search(r"serving http://127\.0\.0\.1:(\d+)/metrics", line)
        if not check(m is not None, f"metrics --listen: no address said: {line!r}"):
            return
        base = f"http://127.0.0.1:{m.group(1)}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
        with opener.open(base + "/metrics", timeout=TIMEOUT) as r:
            check(r.status == 200, f"/metrics: {r.status}")
            ctype = r.headers.get("Content-Type", "")
            check(ctype.startswith("text/plain; version=0.0.4"), f"/metrics Content-Type {ctype!r}")
            body = r.read().decode()
        check(budget_lines(body, name, "/metrics") == want, "/metrics lines differ:\n" + body)
        for path, code in (("/", 404), ("/metric", 404), ("/metrics/x", 404)):
            try:
                opener.open(base + path, timeout=TIMEOUT)
                check(False, f"{path}: answered 200")
            except urllib.error.HTTPError as e:
                check(e.code == code, f"{path}: {e.code}, expected {code}")
        try:
            opener.open(urllib.request.Request(base + "/metrics", data=b"x", method="POST"), timeout=TIMEOUT)
            check(False, "POST /metrics: answered 200")
        except urllib.error.HTTPError as e:
            check(e.code == 405, f"POST /metrics: {e.code}, expected 405")
        with opener.open(base + "/metrics?x=1", timeout=TIMEOUT) as r:
            check(r.status == 200, f"/metrics?x=1: {r.status}")

        # Clients that drip their request a byte a second, never finishing it (issue 26: one
        # stalled every scrape for 45 s; served one at a time, such clients would hold the server
        # for good). Another scrape is answered beside them.
        stop_drip = threading.Event()

        def drip(sock):
            while not stop_drip.wait(1.0):
                try:
                    sock.send(b"G")
                except OSError:
                    return
        drippers = []
        for _ in range(3):
            sock = socket.create_connection(("127.0.0.1", int(m.group(1))), timeout=TIMEOUT)
            t = threading.Thread(target=drip, args=(sock,), daemon=True)
            t.start()
            drippers.append((sock, t))
        try:
            with opener.open(base + "/metrics", timeout=TIMEOUT) as r:
                check(r.status == 200, f"a scrape beside slow clients: {r.status}")
        except OSError as e:
            check(False, f"a scrape beside slow clients was not answered: {e}")
        stop_drip.set()
        for sock, t in drippers:
            t.join()
            sock.close()

        # The port is taken now: a second server cannot listen there.
        q = run("metrics", "--listen", f"127.0.0.1:{m.group(1)}", rc=4)
        check("cannot listen" in q.stderr, f"a port in use: {q.stderr}")
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=TIMEOUT)
    check(p.returncode == 0, f"metrics --listen, SIGTERM: exit {p.returncode}: {err!r}")


def check_live_top(opts, name):
    master, slave = pty.openpty()
    p = subprocess.Popen([opts.cupool, "top", "--interval", "10ms"], stdin=slave, stdout=slave,
                         stderr=subprocess.PIPE)
    os.close(slave)
    try:
        out = read_until(master, lambda d: d.count(b"\x1b[H") >= 3 and name.encode() in d)
        check(out.count(b"\x1b[H") >= 3 and f"budget {name}".encode() in out,
              f"top on a terminal: not redrawn, or the budget missing: {out[:300]!r}")
    finally:
        p.send_signal(signal.SIGINT)
        rest = read_until(master, lambda d: False)  # to EOF: the program's exit closes the pty
        p.wait(timeout=TIMEOUT)
        os.close(master)
    check(p.returncode == 0, f"top on a terminal, SIGINT: exit {p.returncode}: {p.stderr.read()!r}")
    check((out + rest).endswith(b"\x1b[?25h"), f"top on a terminal: cursor not shown again at exit: {rest[-50:]!r}")


def start_ticks(pid):
    stat_line = open(f"/proc/{pid}/stat").read()
    return int(stat_line[stat_line.rindex(")") + 2:].split()[22 - 3])


def write_segment(path, lay, limit, slots, magic=None):
    seg, sl = lay["segment"], lay["slot"]
    buf = bytearray(lay["segment_size"])
    struct.pack_into("<QIIII", buf, seg["magic"], lay["magic"] if magic is None else magic, lay["layout_version"],
                     lay["max_members"], lay["max_devices"], 1)
    buf[seg["limit"]:seg["limit"] + len(limit)] = limit
    for index, s in slots.items():
        base = seg["slots"] + index * sl["size"]
        struct.pack_into("<QQ", buf, base + sl["owner"], s["pid"] << 8 | lay["states"]["live"], s["start_ticks"])
        for field in ("held", "in_use", "reserved", "waiting"):
            for dev, v in s.get(field, {}).items():
                struct.pack_into("<Q", buf, base + sl[field] + 8 * dev, v)
        struct.pack_into("<Q", buf, base + sl["ooms"], s.get("ooms", 0))
        buf[base + sl["command"]:base + sl["command"] + len(s["command"])] = s["command"]
    with open(path, "wb") as f:
        f.write(buf)


def hold_slot_lock(path, lay, slot):
    """Holds the lock of `slot` in the segment at `path`, as a live member does (a POSIX lock of
    this process, which the readers' OFD lock queries see): returns the open file to keep."""
    f = open(path, "rb+")
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, lay["lock_base"] + 1 + slot, os.SEEK_SET)
    return f


def check_crafted(opts, run):
    lay = json.loads(subprocess.run([opts.member, "--layout"], capture_output=True, check=True).stdout)
    with tempfile.TemporaryDirectory() as d:
        me, ticks = os.getpid(), start_ticks(os.getpid())
        dead = 0x7FFFFFF0  # above any pid_max
        odd = b'new\nline"\\\xff\x1b[31m'
        write_segment(os.path.join(d, "cupool-share-4242-crafted"), lay, b"8GiB", {
            0: {"pid": me, "start_ticks": ticks, "command": odd, "held": {3: 5 * MiB}, "in_use": {3: 1},
                "reserved": {3: 2}, "waiting": {3: 7 * MiB}, "ooms": 3},
            5: {"pid": dead, "start_ticks": 1, "command": b"old", "held": {0: 1}},
            # The same pid and command, started at another time: an earlier process, gone.
            7: {"pid": me, "start_ticks": 1, "command": odd, "held": {3: 4}},
        })
        write_segment(os.path.join(d, "cupool-share-g77-empty"), lay, b"", {})
        with open(os.path.join(d, "cupool-share-4242-small"), "wb") as f:
            f.write(b"tiny")
        write_segment(os.path.join(d, "cupool-share-4242-badmagic"), lay, b"", {}, magic=0x1234)
        zero = os.path.join(d, "cupool-share-4242-zero")
        with open(zero, "wb") as f:
            f.write(bytes(lay["segment_size"]))
        os.utime(zero, (time.time() - 3600, time.time() - 3600))  # its creator died long ago
        # The owners their names give (issue 26: the name alone is no proof). Only root can
        # make files of another user: as anyone else the check cannot be made.
        if os.getuid() != 0:
            print("skipped: crafted segments of another user need root")
            return
        owner = "4242"
        for f in os.listdir(d):
            if f.startswith("cupool-share-"):
                os.chown(os.path.join(d, f), 4242, 77)
        # A limit field with no NUL in its 256 bytes (issue 26: read without a bound, 151 531
        # characters came out, from past the mapping).
        write_segment(os.path.join(d, "cupool-share-4242-longlimit"), lay, b"9" * lay["segment"]["limit_size"], {})
        os.chown(os.path.join(d, "cupool-share-4242-longlimit"), 4242, 77)
        planted = os.path.join(d, "cupool-share-4242-planted")  # named as 4242's, made by root
        write_segment(planted, lay, b"1GiB", {})
        alive = hold_slot_lock(os.path.join(d, f"cupool-share-{owner}-crafted"), lay, 0)
        os.symlink(f"cupool-share-{owner}-crafted", os.path.join(d, f"cupool-share-{owner}-link"))
        with open(os.path.join(d, "not-a-budget"), "wb") as f:
            f.write(b"ignored")
        bad = ["cupool-share-4242-badmagic", "cupool-share-4242-link", "cupool-share-4242-small", "cupool-share-4242-zero",
               "cupool-share-4242-planted"]

        p = run("top", "--json", "--dir", d, rc=0)
        doc = json.loads(p.stdout)
        for b in bad:
            check(f"{os.path.join(d, b)}:" in p.stderr, f"top: no warning naming {b}: {p.stderr}")
        check(len(doc["skipped"]) == 5, f"top --json skipped: {doc['skipped']}")
        longlimit = [b for b in doc["budgets"] if b["name"] == "longlimit"]
        check(len(longlimit) == 1 and len(longlimit[0]["limit"] or "") < lay["segment"]["limit_size"],
              f"a limit field without its NUL: {[len(b['limit'] or '') for b in longlimit]} characters")
        doc["budgets"] = [b for b in doc["budgets"] if b["name"] != "longlimit"]
        check([b["name"] for b in doc["budgets"]] == ["crafted", "empty"], f"budgets: {doc['budgets']}")
        crafted = doc["budgets"][0]
        oddtext = 'new\nline"\\\ufffd\x1b[31m'
        check(crafted["owner"] == "4242" and doc["budgets"][1]["owner"] == "g77", "owners")
        check(crafted["devices"] == [
            {"device": 0, "budget": "8GiB", "budget_bytes": 8 * GiB, "held_bytes": 1, "held_by_gone_bytes": 1},
            {"device": 3, "budget": "8GiB", "budget_bytes": 8 * GiB, "held_bytes": 5 * MiB + 4, "held_by_gone_bytes": 4}],
            f"crafted devices: {crafted['devices']}")
        # Members that are gone drop out (issue 26), counted apart with what they still hold.
        check(crafted["members"] == [
            {"pid": me, "command": oddtext, "alive": True, "ooms": 3, "devices": [
                {"device": 3, "held_bytes": 5 * MiB, "in_use_bytes": 1, "reserved_bytes": 2, "waiting_bytes": 7 * MiB}]}]
              and crafted["gone_members"] == 2,
              f"crafted members: {json.dumps(crafted['members'], indent=1)}")
        check(doc["budgets"][1]["limit"] is None and doc["budgets"][1]["devices"] == [] and
              doc["budgets"][1]["members"] == [], f"empty budget: {doc['budgets'][1]}")

        p = run("top", "--once", "--dir", d, rc=0)
        check("\x1b" not in p.stdout and "\ufffd" in p.stdout and "new?line" in p.stdout,
              f"top text: a command's control characters reach the terminal: {p.stdout!r}")
        check("cupool top: 3 budgets, 1 member" in p.stdout and "no members" in p.stdout and
              "2 members gone, holding 5 B" in p.stdout, f"top text: {p.stdout}")

        p = run("metrics", "--dir", d, rc=0)
        _, samples = parse_exposition(p.stdout, "metrics --dir")
        for b in bad:
            check(f"{os.path.join(d, b)}:" in p.stderr, f"metrics: no warning naming {b}: {p.stderr}")
        label = 'new\\nline\\"\\\\\ufffd\x1b[31m'
        mine = f'share="crafted",owner="4242",pid="{me}",command="{label}"'
        old = f'share="crafted",owner="4242",pid="{dead}",command="old"'
        check(not any(l.startswith(f"cupool_member_up{{{old}}}") for l in samples), "metrics: a gone member exported")
        for line in (f"cupool_member_up{{{mine}}} 1",
                     f'cupool_member_held_bytes{{{mine},device="3"}} {5 * MiB}',
                     f'cupool_member_waiting_bytes{{{mine},device="3"}} {7 * MiB}',
                     f"cupool_member_out_of_memory_total{{{mine}}} 3",
                     f'cupool_share_held_bytes{{share="crafted",owner="4242",device="3"}} {5 * MiB + 4}',
                     'cupool_share_members{share="crafted",owner="4242"} 1',
                     'cupool_share_gone_members{share="crafted",owner="4242"} 2',
                     'cupool_share_members{share="empty",owner="g77"} 0',
                     "cupool_share_segments_unreadable 5"):
            check(line in samples, f"metrics --dir lacks {line!r}:\n{p.stdout}")
        series = [s.rsplit(" ", 1)[0] for s in samples]
        check(len(series) == len(set(series)), f"metrics --dir: duplicate series: {sorted(series)}")


def check_usage(run):
    for args in (["top", "--bogus"], ["top", "extra"], ["top", "--interval", "0"], ["top", "--interval", "soon"],
                 ["top", "--interval="], ["top", "--dir", "/no/such/dir"], ["metrics", "--dir", "/no/such/dir"],
                 ["metrics", "--listen", "127.0.0.1:0", "--textfile", "x.prom"], ["metrics", "--listen", "nocolon"],
                 ["metrics", "--listen", "127.0.0.1:99999"], ["metrics", "--listen", "127.0.0.1:http"],
                 ["metrics", "--interval", "1s"], ["metrics", "--listen", "127.0.0.1:0", "--once"],
                 ["metrics", "--textfile", "x.prom", "--interval", "0"], ["metrics", "--textfile"]):
        p = run(*args, rc=2)
        check(f"Try 'cupool {args[0]} --help'" in p.stderr, f"cupool {' '.join(args)}: {p.stderr}")
    for sub in ("top", "metrics"):
        p = run(sub, "--help", rc=0)
        check(p.stdout.startswith(f"usage: cupool {sub}") and "exit status" in p.stdout, f"{sub} --help: {p.stdout[:100]}")
    p = run("--help", rc=0)
    check(re.search(r"^  top ", p.stdout, re.M) and re.search(r"^  metrics ", p.stdout, re.M),
          f"cupool --help does not list top and metrics: {p.stdout}")
    with open("/dev/full", "w") as full:
        for args in (["top", "--once"], ["top", "--json"], ["metrics"]):
            p = run(*args, stdout=full)
            check(p.returncode == 4 and "standard output" in p.stderr,
                  f"cupool {' '.join(args)} >/dev/full: exit {p.returncode}, expected 4: {p.stderr}")


def check_truncated_under_reader(opts, lay):
    """Issue 26: another user truncating a segment of their own while `cupool metrics` read it
    killed the server with SIGBUS (the segment was mapped). Now it is copied: a scrape while the
    file shrinks and grows again skips or shows it, and the server lives on."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"cupool-share-{os.getuid()}-shrinking")
        write_segment(path, lay, b"1GiB", {0: {"pid": os.getpid(), "start_ticks": 1, "command": b"x", "held": {0: 1}}})
        full = open(path, "rb").read()
        p = subprocess.Popen([opts.cupool, "metrics", "--listen", "127.0.0.1:0", "--dir", d], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        stop = threading.Event()

        def shrink():
            while not stop.is_set():
                with open(path, "r+b") as f:
                    f.truncate(0)
                    f.seek(0)
                    f.write(full)
        try:
            line = read_until(p.stderr.fileno(), lambda data: b"\n" in data).decode()
            m = re.search(r"serving http://127\.0\.0\.1:(\d+)/metrics", line)
            if not check(m is not None, f"metrics --listen: no address said: {line!r}"):
                return
            t = threading.Thread(target=shrink)
            t.start()
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            answered = 0
            for _ in range(200):
                try:
                    with opener.open(f"http://127.0.0.1:{m.group(1)}/metrics", timeout=TIMEOUT) as r:
                        answered += r.status == 200
                except OSError:
                    break
            stop.set()
            t.join()
            check(answered == 200 and p.poll() is None,
                  f"metrics while a segment was truncated and rewritten: {answered} of 200 answered, "
                  f"server exit {p.poll()}")
        finally:
            stop.set()
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=TIMEOUT)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--member", required=True)
    opts = ap.parse_args()
    opts.cupool, opts.member = os.path.abspath(opts.cupool), os.path.abspath(opts.member)
    run = Run(opts)
    name = "check-share-" + secrets.token_hex(6)
    owner = str(os.getuid())
    segment = f"/dev/shm/cupool-share-{owner}-{name}"
    try:
        check_real_budget(opts, run, name, owner, segment)
    finally:
        if os.path.exists(segment):
            os.unlink(segment)
    check_crafted(opts, run)
    check_truncated_under_reader(opts, json.loads(subprocess.run([opts.member, "--layout"], capture_output=True,
                                                                 check=True).stdout))
    with tempfile.TemporaryDirectory() as d:
        check_usage(lambda *a, **kw: run(*a, cwd=d, **kw))
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
