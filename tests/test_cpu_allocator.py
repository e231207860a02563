"""glibc keeps freed activations for reuse once the engine has tuned malloc (vlserve/cpu/allocator.py):
a large tensor then comes from the heap, not from a fresh mmap whose every page faults on first write.

Each check runs in a fresh interpreter: the tuning is process-wide and takes hold for threads that
first allocate after it, as the engine's do."""

import subprocess
import sys

from vlserve.cpu.allocator import keep_freed_memory

PROBE = """
import ctypes, sys, threading
if sys.argv[1] == "tuned":
    from vlserve.cpu.allocator import keep_freed_memory
    assert keep_freed_memory() and keep_freed_memory()
import torch

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
mallinfo2.restype = MallInfo2  # hblkhd: bytes in chunks glibc serves by mmap
seen = []

def allocate():  # on a new thread, as the engine loop allocates
    for _ in range(2):
        before = mallinfo2().hblkhd
        t = torch.empty(96 * 1024 * 1024 // 4)  # past glibc's 32 MB ceiling and a thread heap's 64 MB
        t.fill_(1.0)
        seen.append(mallinfo2().hblkhd - before)
        del t

worker = threading.Thread(target=allocate)
worker.start()
worker.join()
print(max(seen))
"""


def mapped_bytes_for_a_96mb_tensor(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_a_large_activation_comes_from_the_heap_after_tuning():
    assert mapped_bytes_for_a_96mb_tensor("tuned") < 1024 * 1024
    # and the probe does tell: without the tuning the same tensor is mapped fresh
    assert mapped_bytes_for_a_96mb_tensor("default") >= 96 * 1024 * 1024


def test_the_tuning_is_applied_once_and_reports_success():
    assert keep_freed_memory() is True
    assert keep_freed_memory.cache_info().currsize == 1
