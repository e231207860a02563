"""A request's state as it moves through the scheduler."""

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from vlserve.sampling.params import SamplingParams


@dataclass
class ImageSpan:
    """One image (or video frame) occupying positions start .. start+length-1 of the prompt."""
    start: int
    length: int
    content_hash: bytes
    pixel_values: Any  # np.ndarray [3, H, W] float32; dropped once its embedding is computed or cached

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass
class StepOutput:
    """What one scheduling step produced for one request (sent to whoever waits on it)."""
    rid: str
    new_ids: list[int]
    new_logprobs: list[float]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
    meta: dict = field(default_factory=dict)
    replace_from: int | None = None  # jump-forward retokenised the output from this index on


@dataclass(eq=False)
class Req:
    rid: str
    input_ids: list[int]  # prompt; image positions hold pseudo-token ids
    sampling: SamplingParams
    images: list[ImageSpan] = field(default_factory=list)
    return_logprob: bool = False
    logprob_start_len: int = -1
    sink: Callable[[StepOutput], None] | None = None
    arrival_step: int = 0
    arrival_time: float = field(default_factory=time.monotonic)

    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    input_logprobs: list[float] = field(default_factory=list)
    req_row: int | None = None
    kv_len: int = 0  # positions 0..kv_len-1 have KV in the pool (mapped in req_to_token)
    tree_len: int = 0  # of those, the first tree_len are owned by the radix tree (last_node's path)
    last_node: Any = None  # locked TreeNode, or None when not admitted
    cached_tokens: int = -1  # prompt tokens served from the cache at first admission (-1 = not yet)
    matched_len: int = 0  # written by the schedule policy
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    constraint: Any = None  # ConstraintState for regex / json_schema requests
    first_token_time: float | None = None
    num_retractions: int = 0

    @property
    def seq(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def key(self) -> list[int]:
        """The radix-tree key: every token so far (pseudo-token ids for image positions)."""
        return self.seq

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def pending_len(self) -> int:
        """Tokens whose KV must be computed before the next token can be sampled."""
        return self.seq_len - self.kv_len

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining_new_tokens(self) -> int:
        return max(0, self.sampling.max_new_tokens - len(self.output_ids))
