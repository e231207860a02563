"""One scheduling step as data: the scheduler's plan, and what the runner computed for it.

    plan = scheduler.schedule()      # which requests advance, by how many tokens, into which slots
    result = runner.run(plan)        # batch, forward, logits rows, sampling — writes no Req field
    scheduler.process(result)        # finish checks, constraints, cache insertion, outputs
"""

from dataclasses import dataclass, field
from typing import Any

import torch

from vlserve.core.forward_batch import ForwardMode
from vlserve.core.request import Req


@dataclass
class PlannedExtend:
    """req's positions kv_len .. kv_len+num_tokens-1 are computed this step, into `slots`."""
    req: Req
    num_tokens: int
    slots: torch.Tensor  # already written to req_to_token
    sample: bool = False  # sample the token after this slice (its prefill completes, no forced jump)
    jump: Any = None  # a constraint's forced start (JumpForward), applied instead of sampling


@dataclass
class SampledToken:
    token: int
    logprob: float
    top: list[tuple[float, int]] = field(default_factory=list)  # (logprob, id), best first, if asked


@dataclass
class SampleFailure:
    """Why sampling failed for one request: status 400 when its own values caused it (InvalidRequest),
    500 for a fault of the server."""
    message: str
    status: int = 500


@dataclass
class StepResult:
    """Per plan item, in plan order."""
    plan: list[PlannedExtend]
    mode: ForwardMode
    sampled: list[SampledToken | None]  # None where not sampled, or where sampling failed
    sample_errors: list["SampleFailure | None"]  # why sampling failed for that request alone
    # prompt logprobs found: (logprob, id, top alternatives as (logprob, id) pairs)
    input_logprobs: list[list[tuple[float, int, list]]] = field(default_factory=list)
