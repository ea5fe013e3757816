# A CUDA tensor shared with another process by torch.multiprocessing (CUDA IPC, start method
# spawn). A small tensor is allocated first, so that under a cupool pool the shared tensor's
# block is not the first one (under the vmm policy: not at the start of the pool's virtual range);
# with PyTorch's cache on, the shared tensor also lies inside its block, between two neighbours of
# its own size (`pre`, before it, and `post`). The other process reads the shared tensor and adds
# 1 to it in place; this process then checks that the change landed in that tensor and nowhere
# else. Prints one JSON line (or the error raised), with what test/gpu/run_all.py (group vmmipc)
# needs to find the block in cupool's trace: this process's pid, the tensor's address and size,
# and what the driver itself says of the memory in each process (cuPointerGetAttribute, which
# cupool passes through: legacy_ipc_capable is 1 for cuMemAlloc'd memory and 0 for the vmm
# policy's cuMemCreate'd granules; allowed_handle_types the shareable handle types it was created
# with). Works without cupool and under every policy (test/gpu/run_multi.sh runs it too).
import ctypes
import json
import os

import torch
import torch.multiprocessing as mp

N = 1_000_000  # 4 MB of float32: with the cache on, pre, t and post share one 20 MiB segment


def driver_view(ptr):
    """The driver's answers for the memory at ptr; None where a query failed."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        legacy, types = ctypes.c_int(0), ctypes.c_ulonglong(0)
        r1 = cuda.cuPointerGetAttribute(ctypes.byref(legacy), 10, ctypes.c_uint64(ptr))  # IS_LEGACY_CUDA_IPC_CAPABLE
        r2 = cuda.cuPointerGetAttribute(ctypes.byref(types), 14, ctypes.c_uint64(ptr))   # ALLOWED_HANDLE_TYPES
        return {"legacy_ipc_capable": legacy.value if r1 == 0 else None,
                "allowed_handle_types": types.value if r2 == 0 else None, "rc": [r1, r2]}
    except OSError as e:
        return {"error": repr(e)[:200]}


def child(q, r):
    try:
        t = q.get()
        s = float(t.sum().item())
        t.add_(1.0)
        torch.cuda.synchronize()
        r.put({"sum": s, "pid": os.getpid(), "ptr": t.data_ptr(), "driver": driver_view(t.data_ptr())})
    except Exception as e:  # noqa: BLE001 - the parent reports it
        r.put({"error": repr(e)[:300], "pid": os.getpid()})
    q.get()  # hold the tensor until the parent has looked


if __name__ == "__main__":
    mp.set_start_method("spawn")
    q, r = mp.Queue(), mp.Queue()
    p = mp.Process(target=child, args=(q, r))
    p.start()
    keep = torch.ones(1000, device="cuda")
    pre = torch.full((N,), 7.0, device="cuda")
    t = torch.arange(N, device="cuda", dtype=torch.float32)
    post = torch.full((N,), 9.0, device="cuda")
    torch.cuda.synchronize()
    expected = float(t.sum().item())
    got, err, written, untouched, answer = None, None, None, None, {}
    try:
        q.put(t)
        answer = r.get(timeout=45)
        got = answer.get("sum")
        err = answer.get("error")
        written = bool(torch.equal(t, torch.arange(N, device="cuda", dtype=torch.float32) + 1))
        untouched = (float(keep.sum().item()) == 1000.0 and bool(torch.all(pre == 7.0).item())
                     and bool(torch.all(post == 9.0).item()))
        q.put(None)
    except Exception as e:  # noqa: BLE001 - the error is the result
        err = repr(e)[:300]
    p.join(timeout=15)
    if p.is_alive():
        p.kill()
    print(json.dumps({"check": "ipc", "expected": expected, "got": got, "same": got == expected,
                      "child_write_seen": written, "other_tensor_untouched": untouched, "error": err,
                      "pid": os.getpid(), "child_pid": answer.get("pid"), "child_exit": p.exitcode,
                      "ptr": t.data_ptr(), "bytes": t.numel() * 4, "first_ptr": keep.data_ptr(),
                      "caching": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1",
                      "driver": driver_view(t.data_ptr()), "child_driver": answer.get("driver")}), flush=True)
