"""Reading what the GPU checks print: shared by run_all.py (on the GPU machine) and
docs_tables.py (here, over the results files kept in docs/gpu-runs)."""
import json
import re


def last_json(text):
    """The last line of `text` that is a JSON object (what a check prints as its result), or {}."""
    for line in reversed((text or "").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                pass
    return {}


def exact_result(text):
    """The bit-exact result a reference workload prints: transformer_step.py's loss as float.hex,
    jax_mlp_step.py's digest of the weights after the last step; None if it printed neither."""
    m = re.search(r"(?:loss_hex|params)=(\S+)", text or "")
    return m.group(1) if m else None
