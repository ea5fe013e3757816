#!/usr/bin/env python3
"""Writes the linker version script of libcupool.so from hooks.def: the hooks are exported,
everything else (the static C++ runtime, spdlog, fmt, our own code) stays local."""
import re
import sys

src, out = sys.argv[1], sys.argv[2]
names = []
for line in open(src, encoding="utf-8"):
    m = re.match(r"\s*CUPOOL_(?:RUNTIME|DRIVER|WORK|LOADER|NVML)_HOOK\((\w+)", line)
    if m:
        names.append(m.group(1))
if not names:
    sys.exit(f"{src}: no hooks found")
with open(out, "w", encoding="utf-8") as f:
    f.write("{\n  global:\n")
    for n in names:
        f.write(f"    {n};\n")
    f.write("  local:\n    *;\n};\n")
