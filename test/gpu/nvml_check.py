#!/usr/bin/env python3
"""NVML's memory queries inside a process under cupool say what cudaMemGetInfo says, on the GPU.

  nvml_check.py PATH/TO/libcupool.so [--limit 2GiB] [--share-limit 1GiB]

Runs itself twice as a child that allocates 256 MiB with torch, then asks NVML through ctypes
(dlopen of libnvidia-ml.so.1 + dlsym, as pynvml does; pynvml need not be installed, and is asked
too where it is) for nvmlDeviceGetMemoryInfo and nvmlDeviceGetMemoryInfo_v2 of torch's device
(matched by UUID), and
torch.cuda.mem_get_info() (cudaMemGetInfo) before and after:
- without cupool: NVML gives the whole device (its total within 5% of the device's);
- under cupool with CUPOOL_LIMIT: NVML's total and free must equal torch's (total = the cap,
  used = total - free, v2 reserved = 0), and differ from the whole device. With --share-limit,
  the process is also the one member of a shared budget (CUPOOL_SHARE) that small: free is
  within it.
Prints one JSON line with the figures of both runs ("ok": true or false, "failures") and exits 1
on any failure. `--child` is the child (run it under LD_PRELOAD yourself to check one process).
"""
import ctypes
import json
import os
import re
import subprocess
import sys
import uuid

GiB = 1 << 30


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


NVML_MEMORY_V2 = ctypes.sizeof(MemoryV2) | (2 << 24)  # NVML_STRUCT_VERSION(Memory, 2)


def hex_digits(uuid_text):
    """The 32 hex digits of a UUID, whatever its prefix ("GPU-") and dashes."""
    t = uuid_text.lower()
    for prefix in ("gpu-", "mig-"):
        if t.startswith(prefix):
            t = t[len(prefix):]
    return t.replace("-", "")


def child():
    import torch

    under_cupool = "libcupool" in os.environ.get("LD_PRELOAD", "")
    keep = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # noqa: F841 - held during the queries
    torch.cuda.synchronize()
    props = torch.cuda.get_device_properties(0)
    out = {"cupool": under_cupool, "limit": os.environ.get("CUPOOL_LIMIT"), "device_total": props.total_memory,
           "device_uuid": str(props.uuid)}
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    for name in ("nvmlInit_v2", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetUUID",
                 "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2", "nvmlShutdown"):
        getattr(nvml, name).restype = ctypes.c_int
    rc = nvml.nvmlInit_v2()
    if rc != 0:
        out["error"] = f"nvmlInit_v2: {rc}"
        return out
    count = ctypes.c_uint()
    nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
    handle = None
    for i in range(count.value):
        h = ctypes.c_void_p()
        text = ctypes.create_string_buffer(96)
        if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0 and \
                nvml.nvmlDeviceGetUUID(h, text, 96) == 0 and hex_digits(text.value.decode()) == hex_digits(out["device_uuid"]):
            handle = h
            out["nvml_index"] = i
            out["nvml_uuid"] = text.value.decode()
    if handle is None:
        out["error"] = f"no NVML device has torch's UUID {out['device_uuid']}"
        return out
    free_before, total_before = torch.cuda.mem_get_info()
    v1 = Memory()
    rc1 = nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(v1))
    v2 = MemoryV2(version=NVML_MEMORY_V2)
    rc2 = nvml.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(v2))
    try:  # pynvml, where installed (nvidia-ml-py): the same library, through its own ctypes calls
        import pynvml
        pynvml.nvmlInit()
        m = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(out["nvml_index"]))
        out["pynvml"] = {"total": m.total, "free": m.free, "used": m.used}
        pynvml.nvmlShutdown()
    except ImportError:
        pass
    free_after, total_after = torch.cuda.mem_get_info()
    nvml.nvmlShutdown()
    out.update({"torch_free": free_before, "torch_total": total_before, "torch_free_after": free_after,
                "torch_total_after": total_after, "nvml_rc": rc1, "nvml_v2_rc": rc2,
                "nvml": {"total": v1.total, "free": v1.free, "used": v1.used},
                "nvml_v2": {"total": v2.total, "reserved": v2.reserved, "free": v2.free, "used": v2.used}})
    return out


def parse_size(text):
    m = re.fullmatch(r"(\d+)\s*(B|KiB|MiB|GiB|TiB)?", text or "")
    if not m:
        return None
    return int(m.group(1)) << {"B": 0, None: 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[m.group(2)]


def run_child(env):
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=env, capture_output=True,
                       text=True, timeout=300)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": f"child exit {p.returncode}: {p.stderr[-1500:]}"}
    return json.loads(lines[-1])


def main():
    if "--child" in sys.argv:
        print(json.dumps(child()), flush=True)
        return 0
    args = [a for i, a in enumerate(sys.argv[1:], 1)
            if not a.startswith("--") and sys.argv[i - 1] not in ("--limit", "--share-limit")]
    if len(args) != 1 or not os.path.exists(args[0]):
        sys.exit(__doc__)
    shim = os.path.abspath(args[0])
    limit = sys.argv[sys.argv.index("--limit") + 1] if "--limit" in sys.argv else "2GiB"
    share_limit = sys.argv[sys.argv.index("--share-limit") + 1] if "--share-limit" in sys.argv else None
    cap = parse_size(limit)
    failures = []

    bare_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("CUPOOL_")}
    bare = run_child(bare_env)
    under_env = dict(bare_env, LD_PRELOAD=shim, CUPOOL_LIMIT=limit, CUPOOL_LOG_LEVEL="warn")
    segment = None
    if share_limit:
        budget = "nvml-check-" + uuid.uuid4().hex[:12]
        segment = f"/dev/shm/cupool-share-{os.getuid()}-{budget}"
        under_env.update(CUPOOL_SHARE=budget, CUPOOL_SHARE_LIMIT=share_limit)
    try:
        under = run_child(under_env)
    finally:
        if segment and os.path.exists(segment):
            os.unlink(segment)

    for name, r in (("without cupool", bare), ("under cupool", under)):
        if "error" in r:
            failures.append(f"{name}: {r['error']}")
        elif r["nvml_rc"] != 0 or r["nvml_v2_rc"] != 0:
            failures.append(f"{name}: NVML returned {r['nvml_rc']} / {r['nvml_v2_rc']}")
    if not failures:
        device = bare["device_total"]
        if abs(bare["nvml"]["total"] - device) > device // 20:
            failures.append(f"without cupool NVML's total {bare['nvml']['total']} is not the device's {device}")
        if under["torch_free"] != under["torch_free_after"] or under["torch_total"] != under["torch_total_after"]:
            failures.append("cudaMemGetInfo moved during the NVML queries: nothing to compare with")
        for key in ("nvml", "nvml_v2", "pynvml"):
            if key not in under:
                continue
            m = under[key]
            if m["total"] != under["torch_total"] or m["free"] != under["torch_free"]:
                failures.append(f"{key}: NVML says total {m['total']} free {m['free']}, torch.cuda.mem_get_info() "
                                f"total {under['torch_total']} free {under['torch_free']}")
            if m["used"] != m["total"] - m["free"]:
                failures.append(f"{key}: used {m['used']} is not total - free")
            if abs(m["total"] - device) < GiB:
                failures.append(f"{key}: NVML's total {m['total']} is still the device's ({device})")
        if under["nvml_v2"]["reserved"] != 0:
            failures.append(f"nvml_v2: reserved {under['nvml_v2']['reserved']}, expected 0 under cupool")
        if cap is not None and under["torch_total"] != cap:
            failures.append(f"torch's total {under['torch_total']} is not the cap {cap}")
        if share_limit and parse_size(share_limit) is not None and under["nvml"]["free"] > parse_size(share_limit):
            failures.append(f"NVML's free {under['nvml']['free']} is beyond the shared budget {share_limit}")
    print(json.dumps({"check": "nvml", "ok": not failures, "limit": limit, "share_limit": share_limit,
                      "failures": failures,
                      "without_cupool": bare, "under_cupool": under}), flush=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
