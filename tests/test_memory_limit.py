"""The test process runs under a memory ceiling (tests/conftest.py), so a runaway allocation fails a
test instead of the machine.

Bug caught: a suite without the ceiling, or with one that does not bind (RLIMIT_AS raised instead of
lowered, a limit set after the fact in a child only): a radix cache that allocates without bound was
killed by the OS, taking the other tests (and engineers' processes) with it.
"""

import os
import resource

import pytest

from conftest import MEMORY_LIMIT_GB


def test_the_ceiling_is_set_as_configured():
    """On by default (8 GiB); VLSERVE_TEST_MEMORY_GB=0 turns it off, and then these tests say so."""
    assert MEMORY_LIMIT_GB > 0, f"VLSERVE_TEST_MEMORY_GB={os.environ.get('VLSERVE_TEST_MEMORY_GB')}: no ceiling"
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    assert soft != resource.RLIM_INFINITY and soft <= MEMORY_LIMIT_GB * 2**30


def test_an_allocation_past_the_ceiling_raises_memory_error():
    """One allocation the size of the whole ceiling: refused at mmap time (no page is touched)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    assert soft != resource.RLIM_INFINITY, "no ceiling: set VLSERVE_TEST_MEMORY_GB > 0"
    with pytest.raises(MemoryError):
        bytearray(soft)
