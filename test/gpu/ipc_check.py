# A CUDA tensor shared with another process by torch.multiprocessing (CUDA IPC). Prints whether
# the other process saw the right data, or the error the sharing raised.
import json

import torch
import torch.multiprocessing as mp


def child(q, r):
    t = q.get()
    r.put(float(t.sum().item()))


if __name__ == "__main__":
    mp.set_start_method("spawn")
    q, r = mp.Queue(), mp.Queue()
    p = mp.Process(target=child, args=(q, r))
    p.start()
    keep = torch.ones(1000, device="cuda")
    t = torch.arange(1_000_000, device="cuda", dtype=torch.float32)
    expected = float(t.sum().item())
    got, err = None, None
    try:
        q.put(t)
        got = r.get(timeout=60)
    except Exception as e:  # noqa: BLE001 - the error is the result
        err = repr(e)[:300]
    p.join(timeout=30)
    if p.is_alive():
        p.kill()
    print(json.dumps({"check": "ipc", "expected": expected, "got": got, "same": got == expected, "error": err}),
          flush=True)
