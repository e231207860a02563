"""Thread counts for the model's CPU kernels and the media pool (vlserve/cpu/threads.py)."""

import pytest
import torch

from vlserve.cpu import threads as cpu_threads
from vlserve.cpu.threads import configure_compute_threads, media_workers, usable_cores


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_default_is_the_usable_cores_not_the_machines(monkeypatch, restore_threads):
    torch.set_num_threads(2)  # torch's default: the physical cores
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 1)  # e.g. taskset -c 0
    assert configure_compute_threads() == 1 and torch.get_num_threads() == 1


def test_an_explicit_count_wins(restore_threads):
    assert configure_compute_threads(3) == 3 and torch.get_num_threads() == 3
    with pytest.raises(ValueError):
        configure_compute_threads(-1)


def test_media_pool_gets_what_is_left_and_at_least_one():
    assert media_workers(2, cores=2) == 1
    assert media_workers(4, cores=8) == 4
    assert media_workers(2, cores=16) == 4  # capped
    assert media_workers(1, cores=3) == 2
    assert 1 <= media_workers(usable_cores()) <= 4
