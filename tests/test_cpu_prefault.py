"""Start-up prefaulting (vlserve/cpu/prefault.py): the pages the first big batch writes are
touched before serving, so that batch does not fault them in. Page faults are counted for real
(getrusage), each case in a fresh interpreter beside a control without the prefault."""

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import torch

from vlserve.engine import engine as engine_module
from vlserve.memory.kv_pool import KVPool
from vlserve.cpu import prefault as cpu_prefault
from vlserve.testing.tiny import make_tiny_model

FAULTS = """
import resource, torch
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
"""


def run_counting(body: str) -> int:
    """Runs `body` (which sets `counted`) in a fresh interpreter; returns counted."""
    code = FAULTS + textwrap.dedent(body) + "\nprint(counted)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def test_a_prefaulted_heap_serves_the_next_activations_without_faults():
    body = """
    from vlserve.cpu.prefault import prefault_heap
    if {prefault}:
        assert prefault_heap(64 << 20) == 64 << 20
    start = faults()
    x = torch.empty(32 << 20, dtype=torch.uint8)
    x.fill_(1)
    counted = faults() - start
    """
    pages = (32 << 20) // 4096
    with_prefault = run_counting(body.format(prefault=True))
    without = run_counting(body.format(prefault=False))
    assert without > pages // 2, f"the control should fault its fresh pages in: {without} faults"
    assert with_prefault < pages // 10, f"{with_prefault} faults after prefaulting"


def test_prefaulted_kv_slots_are_written_without_faults():
    body = """
    from vlserve.memory.kv_pool import KVPool
    from vlserve.cpu.prefault import prefault_kv
    kv = KVPool.create(2, 1 << 16, 4, 64, torch.float32)  # 64 MB a buffer: mapped, not on the heap
    if {prefault}:
        prefault_kv(kv, 4096)
    start = faults()
    for buf in kv.k_buffers + kv.v_buffers:
        buf[:4096].fill_(1.0)
    counted = faults() - start
    """
    pages = 4 * 4096 * 4 * 64 * 4 // 4096
    with_prefault = run_counting(body.format(prefault=True))
    without = run_counting(body.format(prefault=False))
    assert without > pages // 2, f"the control should fault its fresh pages in: {without} faults"
    assert with_prefault < pages // 10, f"{with_prefault} faults after prefaulting"


def test_prefault_kv_zeroes_only_the_first_slots():
    kv = KVPool([torch.full((10, 2, 4), 7.0) for _ in range(3)], [torch.full((10, 2, 4), 7.0) for _ in range(3)])
    assert cpu_prefault.prefault_kv(kv, 4) == 6 * 4 * 2 * 4 * 4
    for buf in kv.k_buffers + kv.v_buffers:
        assert torch.all(buf[:4] == 0) and torch.all(buf[4:] == 7)


def test_activation_bytes_scale_with_rows_and_element_size():
    text = SimpleNamespace(hidden_size=64, intermediate_size=160, num_heads=4, num_kv_heads=2, head_dim=16)
    one = cpu_prefault.activation_bytes(text, 1, 1)
    per_row = 2 * 64 + 2 * 64 + 2 * 32 + 3 * 160  # hidden, q, kv, intermediate
    assert one == cpu_prefault.ACTIVATION_MARGIN * per_row
    assert cpu_prefault.activation_bytes(text, 2048, 2) == 4096 * one


def test_the_engine_prefaults_a_chunk_on_the_cpu(tmp_path, monkeypatch):
    calls = []
    real = engine_module.prefault_for_serving

    def recording(text, kv, chunk_rows, element_size):
        calls.append((chunk_rows, element_size, kv.num_slots))
        return real(text, kv, chunk_rows, element_size)

    monkeypatch.setattr(engine_module, "prefault_for_serving", recording)
    model = make_tiny_model(str(tmp_path), seed=3)
    with engine_module.Engine(model, num_threads=1, max_total_tokens=4096, chunked_prefill_size=256) as e:
        assert e.generate(prompt="USER: hi ASSISTANT:", sampling_params={"max_new_tokens": 2})["meta_info"]
    assert calls == [(256, 4, 4096)]
