"""The engine loads its model and runs it on one thread (vlserve/engine/compute_thread.py), so the
process keeps one OpenMP team of kernel threads."""

import threading

import pytest

from vlserve.engine.compute_thread import ComputeThread
from vlserve.model import loader

from helpers.server_helpers import tiny_model_dir


def test_run_returns_the_result_and_raises_the_error_on_the_caller():
    thread = ComputeThread("test-compute")
    assert thread.run(lambda: threading.current_thread().name) == "test-compute"
    with pytest.raises(ZeroDivisionError):
        thread.run(lambda: 1 / 0)
    assert thread.run(lambda: 7) == 7  # an error leaves the thread serving
    thread.hand_over(lambda: None)  # the last job: the thread ends after it
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_the_model_is_loaded_and_run_on_the_loop_thread(monkeypatch):
    from vlserve import Engine

    seen = {}
    real_load = loader.load_model

    def load(*args, **kwargs):
        seen["load"] = threading.get_ident()
        return real_load(*args, **kwargs)

    monkeypatch.setattr("vlserve.engine.engine.load_model", load)  # records the loading thread
    with Engine(tiny_model_dir(), max_total_tokens=2048) as engine:
        # the loop's step gate runs on the thread that runs each forward, just before it
        engine.loop.step_gate = lambda: seen.setdefault("forward", threading.get_ident())
        engine.generate(prompt="Hello", sampling_params={"max_new_tokens": 2})
        assert seen["load"] == seen["forward"] != threading.get_ident()
        assert engine.loop.running
    assert not engine.loop.running  # shutdown ended the thread


def test_a_failed_start_ends_the_thread():
    from vlserve import Engine

    before = {t.ident for t in threading.enumerate() if t.name == "vlserve-engine"}
    with pytest.raises(Exception):
        Engine("/nonexistent/checkpoint")
    for t in threading.enumerate():
        if t.name == "vlserve-engine" and t.ident not in before:
            t.join(timeout=5)
            assert not t.is_alive()
