"""The vision budget per step (--max-num-encoder-input-tokens, issue 48): a long video's frames are
encoded over several steps while a running request decodes every step; a request whose media alone
exceed the context is refused up front saying what it needs."""

import dataclasses

import pytest
import torch

from helpers.server_helpers import mp4

from vlserve.core.config import MemoryConfig, SchedulerConfig
from vlserve.core.errors import InvalidRequest
from vlserve.core.forward_batch import ForwardMode
from vlserve.core.request import ImageSpan, Req
from vlserve.core.sampling_params import SamplingParams
from vlserve.core.step import SampledToken, StepResult
from vlserve.memory.pools import KVMemory, KVShape
from vlserve.metrics import Metrics
from vlserve.scheduler.finish import FinishChecker
from vlserve.scheduler.scheduler import Scheduler
from vlserve.scheduler.vision_budget import VisionBudget

FRAME = 16  # vision tokens per frame


def scheduler(encoder_tokens: int | None) -> Scheduler:
    memory = KVMemory.create(KVShape(1, 1, 4, torch.float32), MemoryConfig(
        max_total_tokens=1024, page_size=1, max_running_requests=4, context_length=512))
    cfg = SchedulerConfig(schedule_policy="fcfs", disable_radix_cache=False, chunked_prefill_size=256,
                          max_num_encoder_input_tokens=encoder_tokens, max_running_requests=4, new_token_ratio=0.5,
                          max_wait_steps=8, prefix_share_threshold=0, disable_jump_forward=False, log_requests=False,
                          request_timeout=None)
    return Scheduler(memory, cfg, Metrics(), FinishChecker(None, (0,)))


def video_request(rid: str, frames: int, first_id: int = 1000) -> Req:
    """2 text tokens, then `frames` frames of FRAME tokens, then 2 text tokens."""
    ids = list(range(first_id, first_id + 4 + frames * FRAME))
    spans = [ImageSpan(2 + i * FRAME, FRAME, bytes([i]) * 16, None) for i in range(frames)]
    return Req(rid, ids, SamplingParams(max_new_tokens=2), spans)


def step(s: Scheduler) -> list[tuple[str, int]]:
    plan = s.schedule()
    sampled = [SampledToken(7, -0.5) if p.sample else None for p in plan]
    s.process(StepResult(plan, ForwardMode.EXTEND, sampled, [None] * len(plan), [[] for _ in plan]))
    return [(p.req.rid, p.num_tokens) for p in plan]


def test_a_long_video_is_encoded_over_several_steps_while_a_request_decodes():
    s = scheduler(encoder_tokens=3 * FRAME)
    decoding = Req("chat", list(range(10, 20)), SamplingParams(max_new_tokens=50))
    s.add(decoding)
    assert step(s) == [("chat", 10)]
    s.add(video_request("video", 10))
    steps = [step(s) for _ in range(4)]
    # 3 frames a step: the text before them and the three frames, then 3, 3, and the last one with the tail
    assert [dict(p)["video"] for p in steps] == [2 + 3 * FRAME, 3 * FRAME, 3 * FRAME, FRAME + 2]
    assert all(dict(p)["chat"] == 1 for p in steps)  # the running request decoded every step


def test_no_budget_takes_the_whole_prompt_and_an_item_over_the_budget_goes_alone():
    s = scheduler(encoder_tokens=None)
    s.add(video_request("video", 10))
    assert step(s) == [("video", 4 + 10 * FRAME)]
    budget = VisionBudget(FRAME // 2)
    req = video_request("big", 2)
    req.kv_len = 2
    assert budget.cap(req, 100) == FRAME  # the first frame alone, though over the budget
    assert budget.cap(video_request("next", 1), 100) == 2  # the budget is spent: the text before its frame


def test_media_over_the_context_are_refused_up_front_with_the_tokens_they_need(server):
    engine = server[0]
    short = dataclasses.replace(engine.builder, context_len=64)  # the server's engine, a 64-token context
    tpi = engine.loaded.config.tokens_per_image
    with pytest.raises(InvalidRequest, match=rf"need {6 * tpi} tokens, over the context length of 64"):
        short.build(prompt="<video>\nWhat?", video_data=mp4(6), video_num_frames=6)


def test_an_extend_ending_where_an_item_starts_does_not_charge_it():
    budget = VisionBudget(4 * FRAME)
    assert budget.cap(video_request("video", 2), 2) == 2  # the text before the first frame
    assert budget.used == 0  # the frame starting at position 2 is the next step's


def test_any_item_already_charged_stops_one_that_does_not_fit():
    req = Req("tiny", list(range(100, 110)), SamplingParams(max_new_tokens=2),
              [ImageSpan(0, 1, b"a" * 16, None), ImageSpan(1, 2, b"b" * 16, None)])
    budget = VisionBudget(2)
    assert budget.cap(req, 10) == 1 and budget.used == 1  # one token spent: the 2-token item waits
