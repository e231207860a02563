"""M-RoPE positions of a prompt from where its pictures and videos sit and their patch grids.

The rule is transformers' `get_rope_index` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), the reference here:
- text tokens take one position on all three axes, counting on from the last;
- a vision run (an image, or a video's temporal patches, which sit contiguously in the prompt)
  starting at position p takes (p + t', p + row, p + column) per merged patch, where t' is the
  temporal patch index times `time_interval` truncated to an integer (Qwen2.5-VL videos:
  tokens_per_second x seconds per temporal patch; everything else 1);
- text after a run resumes at p + max(rows, columns): transformers counts the spatial extent only.
  Qwen's original rule resumed at max(every position) + 1, which is larger when a video runs longer
  in time than in space; vlserve follows transformers;
- generated tokens go on from the prompt's last position, +1 per token on each axis, as
  transformers' generate() places them (it extends the prompt's position_ids by one a step), which
  is also where the text rule above would put the same tokens in a longer prompt: a cached reply
  reused by the next turn's prompt has the positions that prompt gives it. (get_rope_index's
  mrope_position_deltas, max(position) + 1 - length, the original Qwen rule and vLLM's, is larger
  after such a video; transformers uses it only for a forward given a cache and no position_ids.)
Qwen3-VL writes each frame pair of a video as its own run between timestamps; its runs are then
grids with t = 1, as transformers splits them.
"""

from dataclasses import dataclass, replace

import torch

from vlserve.core.positions import MRopePositions


@dataclass(frozen=True)
class VisionRun:
    """One picture, or one video's temporal patches, as consecutive prompt tokens."""
    start: int  # token index of the run's first vision token
    grid_thw: tuple[int, int, int]  # the tower's patch grid before merging (image_grid_thw / video_grid_thw)
    time_interval: float = 1.0  # temporal positions per temporal patch

    def length(self, spatial_merge_size: int) -> int:
        t, h, w = self.grid_thw
        return t * h * w // spatial_merge_size ** 2


def video_time_interval(tokens_per_second: float, second_per_grid_t: float) -> float:
    """Qwen2.5-VL's temporal step, in float32 as transformers computes it from the processor's
    second_per_grid_ts tensor (so the truncation to integers agrees at every patch)."""
    return float(torch.tensor(second_per_grid_t, dtype=torch.float32) * tokens_per_second)


def mrope_positions(prompt_len: int, runs: list[VisionRun], spatial_merge_size: int) -> MRopePositions:
    """Positions [3, prompt_len] and the first generated token's; runs in any order, not overlapping."""
    parts, pos, index = [], 0, 0
    for run in sorted(runs, key=lambda r: r.start):
        if run.start < index:
            raise ValueError(f"vision run at token {run.start} overlaps the run before it (ends at {index})")
        text = run.start - index
        parts.append(torch.arange(pos, pos + text, dtype=torch.int64).expand(3, -1))
        pos += text
        parts.append(_run_positions(run, pos, spatial_merge_size))
        t, h, w = run.grid_thw
        pos += max(h, w) // spatial_merge_size
        index = run.start + run.length(spatial_merge_size)
    if index > prompt_len:
        raise ValueError(f"vision runs end at token {index}, past the prompt's {prompt_len}")
    parts.append(torch.arange(pos, pos + prompt_len - index, dtype=torch.int64).expand(3, -1))
    prompt = torch.cat(parts, dim=1).contiguous()
    last = prompt[:, -1].tolist() if prompt_len else [-1, -1, -1]
    return MRopePositions(prompt, tuple(p + 1 for p in last))


def _run_positions(run: VisionRun, start: int, merge: int) -> torch.Tensor:
    t, h, w = run.grid_thw
    temporal = (torch.arange(t) * torch.tensor(run.time_interval, dtype=torch.float32)).long() + start
    rows = torch.arange(h // merge) + start
    cols = torch.arange(w // merge) + start
    grid = torch.meshgrid(temporal, rows, cols, indexing="ij")
    return torch.stack(grid).reshape(3, -1)


@dataclass(frozen=True)
class MRopeLayout:
    """What a Qwen-VL checkpoint says about its media in the prompt: enough to count a picture's
    tokens and to place a request's M-RoPE positions from its image spans."""
    spatial_merge_size: int
    tokens_per_second: float | None = None  # Qwen2.5-VL: video positions per second; None: one per patch

    def tokens(self, grid_thw: tuple[int, int, int]) -> int:
        t, h, w = grid_thw
        return t * h * w // self.spatial_merge_size ** 2

    def runs(self, spans) -> list[VisionRun]:
        """core.request.ImageSpans → vision runs: a picture is one run; a video's temporal patches
        (role "video", pixels [t, h, w, patch] each) that follow each other without a token
        between them are one run, as transformers' video_grid_thw is one grid."""
        runs: list[VisionRun] = []
        video_end = None  # token index after the last span when it was a video's
        for span in spans:
            t, h, w = span.pixel_values.shape[:3]
            if span.role == "video" and span.start == video_end and runs[-1].grid_thw[1:] == (h, w):
                runs[-1] = replace(runs[-1], grid_thw=(runs[-1].grid_thw[0] + t, h, w))
            else:
                runs.append(VisionRun(span.start, (t, h, w), self._time_interval(span)))
            video_end = span.end if span.role == "video" else None
        return runs

    def _time_interval(self, span) -> float:
        if span.role != "video" or self.tokens_per_second is None:
            return 1.0
        return video_time_interval(self.tokens_per_second, span.second_per_grid_t or 1.0)

    def positions(self, prompt_len: int, spans) -> MRopePositions:
        return mrope_positions(prompt_len, self.runs(spans), self.spatial_merge_size)

