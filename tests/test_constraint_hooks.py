"""ConstraintHooks deciding and applying a jump-forward, with the proposal and the constraint state
stubbed so each edge is set exactly (survivors of the mutation run on vlserve/scheduler/constraints.py:
benchmarks/results/mutation_scheduler.md)."""

from dataclasses import dataclass, field

import pytest

from vlserve.constrained import JumpForward
from vlserve.core.request import Req
from vlserve.core.sampling_params import SamplingParams
from vlserve.scheduler import constraints
from vlserve.scheduler.constraints import FORCED_LOGPROB, ConstraintHooks


@dataclass
class StubState:
    tails: list = field(default_factory=list)  # (keep_len, new ids) of each replace_tail

    def advance(self, token: int) -> None:
        pass

    def is_terminated(self) -> bool:
        return False

    def replace_tail(self, keep_len: int, new_ids: list[int]) -> None:
        self.tails.append((keep_len, list(new_ids)))


@dataclass
class StubCacheManager:
    rewinds: list = field(default_factory=list)

    def rewind(self, req: Req, new_kv_len: int) -> None:
        self.rewinds.append(new_kv_len)
        req.kv_len = new_kv_len


def request(prompt_len: int, outputs: list[int], tree_len: int, max_new_tokens: int = 100) -> Req:
    req = Req("r", list(range(prompt_len)), SamplingParams(max_new_tokens=max_new_tokens), constraint=StubState())
    req.output_ids = list(outputs)
    req.output_logprobs = [-0.5] * len(outputs)
    req.output_top_logprobs = [[(-0.5, t)] for t in outputs]
    req.kv_len, req.tree_len = prompt_len + len(outputs) - 1, tree_len  # the last sampled token has no KV yet
    return req


def propose(monkeypatch, jump: JumpForward) -> None:
    monkeypatch.setattr(constraints, "propose_jump", lambda state, ids: jump)


@pytest.mark.parametrize("keep_len, applied", [(2, True), (1, False)])
def test_a_jump_may_rewrite_everything_after_the_tree_but_nothing_in_it(monkeypatch, keep_len, applied):
    # prompt 4 + outputs [10, 11, 12]; the tree owns positions 0..5 = the prompt and outputs 10, 11
    req = request(4, [10, 11, 12], tree_len=6)
    propose(monkeypatch, JumpForward([10, 11, 12, 13, 14][:keep_len] + [20, 21], keep_len, "xy"))
    cm = StubCacheManager()
    replace_from = ConstraintHooks(cm, context_len=64).after_token(req, 12)
    if applied:  # the rewritten tail starts at position 4 + 2 = tree_len: req's own KV
        assert req.output_ids == [10, 11, 20, 21] and cm.rewinds == [6] and replace_from == 2
    else:
        assert req.output_ids == [10, 11, 12] and cm.rewinds == [] and replace_from is None


def test_forced_text_stops_at_the_end_of_the_context(monkeypatch):
    req = request(6, [10], tree_len=0)  # context 10: room for 4 output tokens, max_new_tokens allows 100
    propose(monkeypatch, JumpForward([10, 20, 21, 22, 23, 24, 25, 26], 1, "forced"))
    ConstraintHooks(StubCacheManager(), context_len=10).after_token(req, 10)
    assert req.output_ids == [10, 20, 21, 22]
    assert req.constraint.tails == [(1, [20, 21, 22])]


def test_forced_text_stops_at_max_new_tokens(monkeypatch):
    req = request(6, [10], tree_len=0, max_new_tokens=3)
    propose(monkeypatch, JumpForward([10, 20, 21, 22, 23], 1, "forced"))
    ConstraintHooks(StubCacheManager(), context_len=64).after_token(req, 10)
    assert req.output_ids == [10, 20, 21]


def test_a_jump_keeps_one_logprob_per_output_token(monkeypatch):
    req = request(4, [10, 11, 12], tree_len=0)
    propose(monkeypatch, JumpForward([10, 11, 30, 31, 32], 2, "forced"))
    ConstraintHooks(StubCacheManager(), context_len=64).after_token(req, 12)
    assert req.output_ids == [10, 11, 30, 31, 32]
    assert req.output_logprobs == [-0.5, -0.5] + [FORCED_LOGPROB] * 3
    assert req.output_top_logprobs == [[(-0.5, 10)], [(-0.5, 11)], [], [], []]
