"""A served model's resident memory stays within its budget: one copy of the weights in the serving
dtype, the KV pool, and a fixed allowance (issue 52: <= 1.1 x the checkpoint's bytes in the serving
dtype + the KV pool + 400 MB), in fp32 and bf16, with every fast path on (our kernels, the packed
layouts, the fused ops).

The serving process is a real `vlserve serve` on a random checkpoint of 400 MB in fp32 (100 M
parameters: large enough that a second copy of the weights, 400 MB / 200 MB, would pass the bound
by far), written by the project's tiny writer with bigger shapes. Its memory is read from
/proc/PID/status after it has answered a request: RssAnon + RssShmem, the memory the process holds
itself. The shared libraries' file-backed pages (torch's and oneDNN's code, ~180 MB, shared with
every Python process on the machine) are left out; the checkpoint, read through a memory map while
loading, must not stay mapped either (its pages would be RssFile): that is checked apart.

Bug caught: every linear layer kept its plain weight plus oneDNN's and the decode kernel's packed
copies (3x the weights), and the checkpoint's mapping stayed resident after the copies were made.
"""

import os
import subprocess
import sys

import httpx
import pytest

from helpers.server_helpers import serve_builtin, stop_process
from vlserve.testing.tiny import TinyModelSpec

SPEC = TinyModelSpec(vocab_size=4000, hidden_size=1024, intermediate_size=4096, num_layers=6, num_heads=16,
                     num_kv_heads=4, vision_hidden=64, vision_layers=1, image_size=32, patch_size=8,
                     max_position_embeddings=4096)
POOL_TOKENS = 2048
ALLOWANCE = 400e6


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Written once, under nice (its random init is seconds of both cores on a shared machine)."""
    path = str(tmp_path_factory.mktemp("memory_budget") / "model")
    script = ("from vlserve.testing.tiny import TinyModelSpec, make_tiny_model; "
              f"make_tiny_model({path!r}, seed=0, spec={SPEC!r})")
    subprocess.run(["nice", "-n", "19", sys.executable, "-c", script], check=True, capture_output=True)
    return path


def _status(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "RssAnon", "RssFile", "RssShmem")}


def _weights_file_mapped(pid: int, path: str) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return any(os.path.realpath(path) in line for line in f)


@pytest.mark.parametrize("dtype,element", [("float32", 4), ("bfloat16", 2)])
def test_resident_memory_is_one_copy_of_the_weights(checkpoint, dtype, element):
    from safetensors import safe_open

    weights = os.path.join(checkpoint, "model.safetensors")
    with safe_open(weights, "pt") as f:
        params = sum(_count(f.get_slice(k).get_shape()) for k in f.keys())
    assert params > 100e6, "the checkpoint is too small for a second copy of its weights to show"
    proc, url = serve_builtin("--model", checkpoint, "--dtype", dtype, "--max-total-tokens", str(POOL_TOKENS),
                              "--chunked-prefill-size", "512")
    try:
        answer = httpx.post(url + "/generate", json={"text": "one copy of the weights",
                                                     "sampling_params": {"max_new_tokens": 8}}, timeout=300)
        assert answer.status_code == 200, answer.text
        usage = httpx.get(url + "/get_server_info", timeout=30).json()["internal_states"][0]["memory_usage"]
        status = _status(proc.pid)
        mapped = _weights_file_mapped(proc.pid, weights)
    finally:
        log = stop_process(proc)
    kv_pool = usage["bytes"]["kv_pool"]
    assert usage["token_capacity"] == POOL_TOKENS
    assert kv_pool == POOL_TOKENS * SPEC.num_layers * 2 * SPEC.num_kv_heads * (SPEC.hidden_size // SPEC.num_heads) \
        * element
    # the start-up report: the weights once, every linear packed for our kernel, none left plain
    assert params * element <= usage["bytes"]["weights"] <= 1.02 * params * element, usage
    assert usage["bytes"]["packed_layouts"] > 0.9 * params * element, usage
    assert "keep a plain weight" not in log, log
    owned = status["RssAnon"] + status["RssShmem"]
    bound = 1.1 * params * element + kv_pool + ALLOWANCE
    assert owned <= bound, (f"{dtype}: the server holds {owned / 1e6:.0f} MB, over the budget of {bound / 1e6:.0f} MB "
                            f"({params * element / 1e6:.0f} MB of weights, {kv_pool / 1e6:.0f} MB of KV pool); "
                            f"{status}")
    assert not mapped, "the checkpoint is still mapped into the server after loading (its pages stay resident)"


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
