# A CuPy IPC round trip between two processes (multiprocessing, start method spawn): this process
# makes arrays with CuPy's memory pool off (each array one cudaMalloc, so under cupool each is one
# pool block), the first of them only so that the shared one is not the pool's first block; it
# sends cupy.cuda.runtime.ipcGetMemHandle of the shared array to the other process, which opens
# it with ipcOpenMemHandle, checks the values, adds 1 in place, closes the handle, and closes it
# again (the second close's error is recorded). This process then checks that the change landed
# in the shared array and in neither neighbour. Prints one JSON line, with this process's pid and
# the array's address for test/gpu/run_all.py (group vmmipc) to find the block in cupool's trace.
import json
import multiprocessing as mp
import os

import cupy as cp

N = 1 << 20


def cuda_error(e):
    """A CUDA error as (code, text); other exceptions as (None, text)."""
    return {"status": getattr(e, "status", None), "text": str(e)[:200]}


def child(q, r):
    out = {"pid": os.getpid()}
    try:
        cp.cuda.set_allocator(None)
        handle, n = q.get()
        ptr = cp.cuda.runtime.ipcOpenMemHandle(handle, cp.cuda.runtime.cudaIpcMemLazyEnablePeerAccess)
        out["ptr"] = int(ptr)
        mem = cp.cuda.UnownedMemory(ptr, n * 4, None)
        a = cp.ndarray((n,), dtype=cp.float32, memptr=cp.cuda.MemoryPointer(mem, 0))
        out["sum"] = float(a.sum())
        a += 1
        cp.cuda.runtime.deviceSynchronize()
        del a, mem
        cp.cuda.runtime.ipcCloseMemHandle(ptr)
        out["close"] = 0
        try:
            cp.cuda.runtime.ipcCloseMemHandle(ptr)
            out["close_again"] = {"status": 0}
        except Exception as e:  # noqa: BLE001 - the error is the result
            out["close_again"] = cuda_error(e)
        getattr(cp.cuda.runtime, "getLastError", lambda: None)()  # clear the close's error, where CuPy has it
        cp.cuda.runtime.deviceSynchronize()
        out["sync_after"] = 0
    except Exception as e:  # noqa: BLE001 - the parent reports it
        out["error"] = cuda_error(e)
    r.put(out)


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q, r))
    p.start()
    cp.cuda.set_allocator(None)
    first = cp.ones(1 << 18, dtype=cp.float32)
    pre = cp.full(N, 7.0, dtype=cp.float32)
    a = cp.arange(N, dtype=cp.float32)
    post = cp.full(N, 9.0, dtype=cp.float32)
    cp.cuda.runtime.deviceSynchronize()
    expected = float(a.sum())
    res = {"check": "cupy_ipc", "pid": os.getpid(), "ptr": int(a.data.ptr), "bytes": N * 4,
           "first_ptr": int(first.data.ptr), "expected": expected}
    try:
        handle = cp.cuda.runtime.ipcGetMemHandle(a.data.ptr)
        res["get"] = 0
        q.put((handle, N))
        answer = r.get(timeout=45)
        res["child"] = answer
        res["same"] = answer.get("sum") == expected
        res["child_write_seen"] = bool((a == cp.arange(N, dtype=cp.float32) + 1).all())
        res["other_arrays_untouched"] = bool((pre == 7.0).all()) and bool((post == 9.0).all()) and \
            float(first.sum()) == float(1 << 18)
    except Exception as e:  # noqa: BLE001 - the error is the result
        res["error"] = cuda_error(e)
    p.join(timeout=15)
    if p.is_alive():
        p.kill()
    res["child_exit"] = p.exitcode
    print(json.dumps(res), flush=True)
