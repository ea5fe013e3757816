#!/usr/bin/env python3
"""Checks what libcupool.so shows the loader: it exports exactly the hooks of hooks.def and
needs nothing but the C library's own parts, so it loads into any process (PyTorch with its
own fmt, conda's old libstdc++) and on machines without our build's packages."""
import re
import subprocess
import sys

lib, hooks_def = sys.argv[1], sys.argv[2]
sanitized = len(sys.argv) > 3 and sys.argv[3] == "sanitized"

listed = set()
for line in open(hooks_def, encoding="utf-8"):
    m = re.match(r"\s*CUPOOL_(?:RUNTIME|DRIVER|WORK|LOADER|NVML)_HOOK\((\w+)", line)
    if m:
        listed.add(m.group(1))

nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
exported = set()
for line in nm.splitlines():
    parts = line.split()
    if len(parts) == 3 and parts[1] in "TtWwVvDdBbRriu":
        exported.add(parts[2].split("@")[0])

errors = []
if not sanitized:
    if exported - listed:
        errors.append(f"exported but not in hooks.def: {sorted(exported - listed)}")
if listed - exported:
    errors.append(f"in hooks.def but not exported: {sorted(listed - exported)}")

readelf = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf))
allowed = {"libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2", "libdl.so.2", "libpthread.so.0", "librt.so.1"}
extra = {n for n in needed - allowed if not (sanitized and re.match(r"lib(asan|ubsan)\.so", n))}
if extra:
    errors.append(f"needs libraries beyond the C library: {sorted(extra)}")

if errors:
    for e in errors:
        print("FAIL:", e)
    sys.exit(1)
print(f"ok: {len(exported)} exported symbols match hooks.def; NEEDED = {sorted(needed)}")
