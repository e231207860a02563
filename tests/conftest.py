"""Shared test setup.

- TRITON_INTERPRET must be set before any @triton.jit decorator runs, so it is set here, at
  collection time, whenever no CUDA GPU is present.
- Tiny models run far faster single-threaded on two cores (about 40 ms against about 1 s per
  generate with two threads), so every test runs torch with one thread.
- The test process has a memory ceiling (RLIMIT_DATA, VLSERVE_TEST_MEMORY_GB, default 8).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import vlserve  # noqa: E402,F401  (first: it settles which `kernels` transformers imports, shadowed_packages.py)

torch.set_num_threads(1)


# ---- a memory ceiling for the test process (and the servers and CLIs it starts) ------------------
# A runaway allocation (say, a radix cache that allocates without bound) then fails its test with
# MemoryError / torch's "can't allocate memory" instead of being killed by the OS with the machine.
# RLIMIT_DATA (private writable memory), not RLIMIT_AS: torch and triton reserve large address
# ranges that they never write. The whole suite peaks at about 1.0 GiB of it (measured on CPU; 2.6 GiB
# of address space). VLSERVE_TEST_MEMORY_GB overrides the ceiling; 0 turns it off.
import resource  # noqa: E402

MEMORY_LIMIT_GB = float(os.environ.get("VLSERVE_TEST_MEMORY_GB", "8"))


def _limit_memory(gb: float) -> None:
    if gb <= 0:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = int(gb * 2**30)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


_limit_memory(MEMORY_LIMIT_GB)


# ---- the HTTP tests' shared server (tests/helpers/server_helpers.py) ---------------------------
import httpx  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="module")
def server():
    """The one real server the HTTP tests share; each module checks it leaked nothing."""
    from helpers.server_helpers import assert_leak_free, shared_server

    engine, srv = shared_server()
    yield engine, srv
    assert_leak_free(engine, srv.url)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server[1].url, timeout=60) as c:
        yield c


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """Runs a CPU kernel test with one and with two torch threads (the suite's default is one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)
