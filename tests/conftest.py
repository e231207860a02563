"""Shared test setup.

- TRITON_INTERPRET must be set before any @triton.jit decorator runs, so it is set here, at
  collection time, whenever no CUDA GPU is present.
- Tiny models run far faster single-threaded on two cores (about 40 ms against about 1 s per
  generate with two threads), so every test runs torch with one thread.
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

torch.set_num_threads(1)


# ---- the HTTP tests' shared server (tests/server_helpers.py) -----------------------------------
import httpx  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="module")
def server():
    """The one real server the HTTP tests share; each module checks it leaked nothing."""
    from server_helpers import assert_leak_free, shared_server

    engine, srv = shared_server()
    yield engine, srv
    assert_leak_free(engine, srv.url)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server[1].url, timeout=60) as c:
        yield c
