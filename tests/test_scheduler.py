"""Scheduler behaviour driven step by step: aging bounds waiting under lpm, in-batch prefix sharing."""

import pytest

from vlserve import Engine
from vlserve.testing.tiny import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("sched")), seed=11)


def _stepped_engine(model_dir, **kwargs) -> Engine:
    """An engine whose loop thread is stopped, so the test drives engine.step() itself."""
    engine = Engine(model_dir, max_total_tokens=4096, **kwargs)
    engine.shutdown()
    return engine


def _finished_step(engine, req, max_steps=200):
    for step in range(max_steps):
        if req.finished:
            return step
        engine.step()
    raise AssertionError("request never finished")


@pytest.mark.parametrize("max_wait_steps", [3, 8])
def test_aging_bounds_the_wait_of_a_request_with_no_cache_hit(model_dir, max_wait_steps):
    engine = _stepped_engine(model_dir, schedule_policy="lpm", max_running_requests=1,
                             max_wait_steps=max_wait_steps)
    sched = engine.scheduler
    hot = "USER: a shared prefix that is already in the cache, asked again and again. Q"
    warm = engine.make_request(prompt=hot, sampling_params={"max_new_tokens": 1})
    sched.add(warm)
    _finished_step(engine, warm)
    cold = engine.make_request(prompt="Completely unrelated words", sampling_params={"max_new_tokens": 1})
    sched.add(cold)
    admitted_at = None
    for step in range(4 * max_wait_steps + 10):
        # a new high-hit request every step: lpm alone would always prefer it over `cold`
        sched.add(engine.make_request(prompt=hot + str(step), sampling_params={"max_new_tokens": 1}))
        engine.step()
        if cold.finished:
            admitted_at = step
            break
    assert admitted_at is not None, "the request with no cache hit starved"
    assert admitted_at <= max_wait_steps + 1
    assert admitted_at >= max_wait_steps - 1  # and before its deadline lpm did prefer the cache hits


def test_lpm_without_aging_pressure_prefers_cache_hits(model_dir):
    engine = _stepped_engine(model_dir, schedule_policy="lpm", max_running_requests=1, max_wait_steps=1000)
    sched = engine.scheduler
    hot = "USER: a shared prefix that is already in the cache. Q"
    warm = engine.make_request(prompt=hot, sampling_params={"max_new_tokens": 1})
    sched.add(warm)
    _finished_step(engine, warm)
    cold = engine.make_request(prompt="Completely unrelated words", sampling_params={"max_new_tokens": 1})
    hits = [engine.make_request(prompt=hot + str(i), sampling_params={"max_new_tokens": 1}) for i in range(3)]
    for r in [cold] + hits:
        sched.add(r)
    order = []
    for _ in range(10):
        engine.step()
        order += [r for r in [cold] + hits if r.finished and r not in order]
    assert order[-1] is cold


def _greedy_texts(engine, prompts, max_new_tokens=6) -> list[str]:
    reqs = [engine.make_request(prompt=p, sampling_params={"max_new_tokens": max_new_tokens, "ignore_eos": True,
                                                           "temperature": 0}, return_logprob=True)
            for p in prompts]
    outputs = {r.rid: [] for r in reqs}
    for r in reqs:
        r.sink = lambda out, rid=r.rid: outputs[rid].extend(out.new_ids)
        engine.scheduler.add(r)
    _finished_step(engine, reqs[-1])
    assert all(r.finished for r in reqs)
    return reqs, [outputs[r.rid] for r in reqs]


def _first_logprobs(reqs) -> list[float]:
    return [r.output_logprobs[0] for r in reqs]


@pytest.mark.parametrize("page_size", [1, 4])
def test_in_batch_prefix_sharing_computes_a_shared_prefix_once_in_the_same_forward(model_dir, page_size):
    shared = "USER: " + " ".join(f"word{i}" for i in range(40)) + " question "
    prompts = [shared + str(i) for i in range(4)]
    engine = _stepped_engine(model_dir, schedule_policy="fcfs", page_size=page_size)
    forwards = engine.metrics.forward_passes.labels(mode="prefill")
    before = forwards._value.get()
    reqs, ids = _greedy_texts(engine, prompts)
    assert forwards._value.get() - before == 1  # one prefill forward: the followers borrowed, none waited
    prefix = len(engine.make_request(prompt=shared, sampling_params={}).input_ids)
    assert all(r.cached_tokens >= prefix - 1 for r in reqs[1:])
    engine.scheduler.cm.check_idle_accounting()
    alone = _stepped_engine(model_dir, schedule_policy="fcfs", prefix_share_threshold=0, page_size=page_size)
    alone_reqs, alone_ids = _greedy_texts(alone, prompts)
    assert alone_ids == ids  # the borrowed keys are the ones each would compute
    # the first token came from the shared forward: its logprob says the follower saw the right keys
    assert _first_logprobs(reqs) == pytest.approx(_first_logprobs(alone_reqs), abs=1e-4)
    alone.scheduler.cm.check_idle_accounting()


def test_a_failed_forward_with_borrowed_kv_leaks_nothing(model_dir, monkeypatch):
    shared = "USER: " + " ".join(f"word{i}" for i in range(40)) + " question "
    engine = _stepped_engine(model_dir, schedule_policy="fcfs")
    real_forward = engine.runner.forward
    calls = []

    def failing_once(batch):
        calls.append(batch)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return real_forward(batch)

    monkeypatch.setattr(engine.runner, "forward", failing_once)
    reqs = [engine.make_request(prompt=shared + str(i), sampling_params={"max_new_tokens": 2}) for i in range(3)]
    for r in reqs:
        engine.scheduler.add(r)
    engine.step()
    assert all(r.finish_reason == "error" for r in reqs)
    engine.scheduler.cm.check_idle_accounting()
    assert engine.scheduler.cm.allocator.num_free_slots == engine.scheduler.cm.capacity  # nothing freed twice
    _, ids = _greedy_texts(engine, [shared + "0", shared + "1"], max_new_tokens=2)
    assert [len(x) for x in ids] == [2, 2]
    engine.scheduler.cm.check_idle_accounting()


def test_requests_wait_for_a_shared_prefix_still_in_chunked_prefill(model_dir):
    engine = _stepped_engine(model_dir, schedule_policy="fcfs", chunked_prefill_size=16)
    shared = "USER: " + " ".join(f"word{i}" for i in range(29)) + " question "
    reqs = [engine.make_request(prompt=shared + str(i), sampling_params={"max_new_tokens": 1}) for i in range(3)]
    assert len(reqs[0].input_ids) % 16, "the last chunk must leave budget for admissions in its step"
    for r in reqs:
        engine.scheduler.add(r)
    for _ in range(40):
        engine.step()
        if all(r.finished for r in reqs):
            break
    prefix = len(engine.make_request(prompt=shared, sampling_params={}).input_ids)
    assert prefix > 3 * 16  # the shared prefix needs several chunks
    assert all(r.cached_tokens >= prefix - 1 for r in reqs[1:]), [r.cached_tokens for r in reqs]
    engine.scheduler.cm.check_idle_accounting()


def test_a_sampling_failure_fails_only_its_own_request(model_dir):
    from vlserve.sampling.sampler import sample as real_sample

    def sample_failing_on_top_k_7(logits, params, generators):
        if any(p.top_k == 7 for p in params):
            raise RuntimeError("sampler bug")
        return real_sample(logits, params, generators)

    prompts = ["USER: tell me about the sea ASSISTANT:", "USER: and the mountains ASSISTANT:"]
    greedy = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    engine = _stepped_engine(model_dir, schedule_policy="fcfs")
    alone = engine.make_request(prompt=prompts[0], sampling_params=greedy)
    engine.scheduler.add(alone)
    _finished_step(engine, alone)

    engine = _stepped_engine(model_dir, schedule_policy="fcfs")
    engine.runner.sampler = sample_failing_on_top_k_7
    good = engine.make_request(prompt=prompts[0], sampling_params=greedy)
    bad = engine.make_request(prompt=prompts[1], sampling_params={**greedy, "temperature": 0.7, "top_k": 7})
    outputs = {}
    for r in (good, bad):
        r.sink = lambda out, rid=r.rid: outputs.setdefault(rid, []).append(out)
        engine.scheduler.add(r)
    _finished_step(engine, good)
    assert bad.finished and bad.finish_reason == "error"
    assert "sampler bug" in outputs[bad.rid][-1].error
    assert good.finish_reason == "length" and good.output_ids == alone.output_ids
    engine.scheduler.cm.check_idle_accounting()
