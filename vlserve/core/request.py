"""A request's state as it moves through the scheduler, and what one step sends back for it.

Who writes which field of Req (docs/ARCHITECTURE.md, "Who writes a request"): each field has one
owner, and only that owner's methods assign it; everyone else reads.
- engine (request building, engine/request_builder.py): everything up to `sink`, before submission;
- scheduler.policy: matched_len (a hint for ordering; never trusted for admission);
- scheduler.cache_manager: req_row, kv_len, tree_len, borrowed, last_node, cached_tokens (the KV it
  owns, and the KV it borrows for one step);
- scheduler.scheduler (process) and scheduler/request_stats.py: output_ids, output_logprobs,
  input_logprobs, finish_reason, admit/first/last token times, and the constraint state's advance
  and jumps (scheduler/constraints.py);
- the runner writes nothing: it reads a plan and returns a StepResult.
"""

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from vlserve.core.positions import MRopePositions
from vlserve.core.sampling_params import SamplingParams


@dataclass
class ImageSpan:
    """One image (or video frame) occupying positions start .. start+length-1 of the prompt."""
    start: int
    length: int
    content_hash: bytes
    # np.ndarray float32 [3, H, W] (or [views, 3, H, W] for anyres), kept for the request's life:
    # after a retraction or an eviction of its KV and of its vision-cache entry, the tower must run on it again.
    pixel_values: Any
    image_size: tuple[int, int] | None = None  # original (height, width), for models whose features depend on it
    role: str = "image"  # or "frame" / "last_frame" of a video (preprocess.ProcessedImage.role); "video" (Qwen-VL)
    # Qwen2.5-VL video patches: seconds one temporal patch spans (transformers' second_per_grid_ts)
    second_per_grid_t: float | None = None

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
    new_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)  # per new id, if asked
    error_status: int = 500  # with an error: 500 internal, 503 the server is shutting down, 504 timed out


@dataclass(eq=False)
class Req:
    rid: str
    input_ids: list[int]  # prompt; image positions hold pseudo-token ids
    sampling: SamplingParams
    images: list[ImageSpan] = field(default_factory=list)
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0  # alternatives reported per output token (with return_logprob)
    sink: Callable[[StepOutput], None] | None = None
    generator: torch.Generator | None = None
    constraint: Any = None  # vlserve.constrained.ConstraintState for regex / json_schema requests
    arrival_time: float = field(default_factory=time.monotonic)
    arrival_step: int = 0  # written by the scheduler when the request enters its queue
    # engine, at build: every token's rotary positions for M-RoPE models (model/mrope.py); None: indices
    mrope: MRopePositions | None = None

    # scheduler.policy
    matched_len: int = 0  # cached prefix length seen when ordering the queue
    # scheduler.cache_manager
    req_row: int | None = None
    kv_len: int = 0  # positions 0..kv_len-1 have KV in the pool (mapped in req_to_token)
    tree_len: int = 0  # of those, the first tree_len are owned by the radix tree (last_node's path)
    # positions [start, end) whose slots another request of this step computes (round_sharing.py);
    # None once the step is processed (CacheManager.settle)
    borrowed: tuple[int, int] | None = None
    last_node: Any = None  # locked TreeNode, or None when not admitted
    cached_tokens: int = -1  # prompt tokens served from the cache at first admission (-1 = not yet)
    # scheduler (process)
    output_ids: list[int] = field(default_factory=list)  # the one copy; the constraint keeps only states
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)  # per output token
    input_logprobs: list[tuple[float, int, list]] = field(default_factory=list)  # (logprob, id, alternatives)
    finish_reason: str | None = None
    finish_matched: int | str | None = None  # the stop token id or stop string that ended it
    admit_time: float | None = None  # first admission (a retracted request keeps it)
    first_token_time: float | None = None
    last_token_time: float | None = None

    @property
    def seq(self) -> list[int]:
        """Every token so far: the radix-tree key (pseudo-token ids at image positions)."""
        return self.input_ids + self.output_ids

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
