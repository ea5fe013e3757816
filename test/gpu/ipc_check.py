# A CUDA tensor shared with another process by torch.multiprocessing (CUDA IPC). A small tensor is
# allocated first, so that under a cupool pool the shared one lies inside the pool's chunk. The
# other process reads the shared tensor and adds 1 to it in place; this process then checks that
# the change landed in that tensor and nowhere else. Prints one JSON line (or the error raised).
import json

import torch
import torch.multiprocessing as mp


def child(q, r):
    t = q.get()
    s = float(t.sum().item())
    t.add_(1.0)
    torch.cuda.synchronize()
    r.put(s)
    q.get()  # hold the tensor until the parent has looked


if __name__ == "__main__":
    mp.set_start_method("spawn")
    q, r = mp.Queue(), mp.Queue()
    p = mp.Process(target=child, args=(q, r))
    p.start()
    keep = torch.ones(1000, device="cuda")
    t = torch.arange(1_000_000, device="cuda", dtype=torch.float32)
    expected = float(t.sum().item())
    got, err, written, untouched = None, None, None, None
    try:
        q.put(t)
        got = r.get(timeout=60)
        written = bool(torch.equal(t, torch.arange(1_000_000, device="cuda", dtype=torch.float32) + 1))
        untouched = float(keep.sum().item()) == 1000.0
        q.put(None)
    except Exception as e:  # noqa: BLE001 - the error is the result
        err = repr(e)[:300]
    p.join(timeout=30)
    if p.is_alive():
        p.kill()
    print(json.dumps({"check": "ipc", "expected": expected, "got": got, "same": got == expected,
                      "child_write_seen": written, "other_tensor_untouched": untouched, "error": err}), flush=True)
