"""The per-request last line of defence of runner/sample_step.py: when the batched sampling call
fails, each request is sampled alone, and only the one that fails gets an error — a 400 when its
own values caused it (nothing left to sample), a 500 for a fault of the server."""

import torch

from vlserve.core.request import Req
from vlserve.core.sampling_params import SamplingParams
from vlserve.runner.sample_step import sample_requests

VOCAB = 6


def _req(rid: str, **params) -> Req:
    return Req(rid, [1, 2, 3], SamplingParams(**params))


def test_a_request_whose_values_leave_no_token_fails_alone_with_a_400():
    logits = torch.zeros(2, VOCAB)
    # min_new_tokens bans EOS (0) and stop_token_ids ban the rest: nothing is left for request "dead"
    dead = _req("dead", min_new_tokens=2, stop_token_ids=list(range(1, VOCAB)))
    tokens, errors = sample_requests(logits, [_req("fine", temperature=0), dead], eos_token_ids=(0,))
    assert tokens[0] is not None and errors[0] is None
    assert tokens[1] is None and errors[1].status == 400 and "no token can be sampled" in errors[1].message


def test_a_fault_of_the_server_fails_alone_with_a_500():
    logits = torch.zeros(2, VOCAB)
    logits[1, 2] = float("nan")  # a model fault in request "broken"'s row
    tokens, errors = sample_requests(logits, [_req("fine"), _req("broken")])
    assert tokens[0] is not None and errors[0] is None
    assert tokens[1] is None and errors[1].status == 500 and "internal error" in errors[1].message
