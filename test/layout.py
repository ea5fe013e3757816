#!/usr/bin/env python3
"""The house rules of the source tree (issue 40), checked on every test run:

- no file of policy/, trace/, shim/ or tools/ is over 800 lines, a .cpp counted with its header;
- calls go down: each folder includes only its own headers and those of the folders below it
  (policy/ at the bottom, then trace/, then shim/ and tools/ side by side);
- inside policy/, the admission chain is below the pools and the pools below ProcessMemory: what
  a lower room needs from a higher one it asks through an interface it owns (MemoryHolder), never
  by including the higher room's header.

  layout.py SOURCE_ROOT        exits 1, with one line per breach
"""
import pathlib
import re
import sys

LIMIT = 800
FOLDERS = ["policy", "trace", "shim", "tools"]
# What each folder may include besides itself.
BELOW = {"policy": [], "trace": ["policy"], "shim": ["trace", "policy"], "tools": ["trace", "policy"]}
# Inside policy/: a room (file stem prefix) and the headers it must never include.
POLICY_DOWN = {
    "shared_budget": ["device_admission.h", "context_pool.h", "vmm_range.h", "process_memory.h"],
    "device_admission": ["context_pool.h", "vmm_range.h", "process_memory.h"],
    "context_pool": ["process_memory.h"],
    "vmm_range": ["process_memory.h"],
    "vmm_cache": ["process_memory.h", "context_pool.h"],
    "suballocator": ["context_pool.h", "process_memory.h"],
    "granules": ["context_pool.h", "process_memory.h"],
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main(argv):
    root = pathlib.Path(argv[1] if len(argv) > 1 else ".").resolve()
    breaches = []
    headers = {f: {p.name for p in (root / f).glob("*.h")} for f in FOLDERS}
    for folder in FOLDERS:
        stems = {}
        for path in sorted((root / folder).glob("*")):
            if path.suffix in (".cpp", ".h", ".c"):
                stems.setdefault(path.stem, []).append(path)
        for stem, paths in sorted(stems.items()):
            lines = sum(len(p.read_text(errors="replace").splitlines()) for p in paths)
            if lines > LIMIT:
                names = " + ".join(str(p.relative_to(root)) for p in paths)
                breaches.append(f"{names}: {lines} lines, over {LIMIT}")
            for p in paths:
                for inc in INCLUDE.findall(p.read_text(errors="replace")):
                    name = pathlib.PurePosixPath(inc).name
                    if folder == "policy":
                        for room, banned in POLICY_DOWN.items():
                            if stem.startswith(room) and name in banned:
                                breaches.append(f"{p.relative_to(root)} includes {inc}: a call back up")
                    if "/" in inc or name in headers[folder]:
                        continue  # its own, or a path (generated or system-like)
                    owners = [f for f in FOLDERS if name in headers[f]]
                    if owners and not any(o in BELOW[folder] for o in owners):
                        breaches.append(f"{p.relative_to(root)} includes {inc} of {owners[0]}/, above {folder}/")
    for b in breaches:
        print("layout:", b)
    if breaches:
        return 1
    print(f"ok: no file of {', '.join(FOLDERS)} over {LIMIT} lines with its header; every include goes down")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
