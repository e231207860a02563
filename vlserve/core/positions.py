"""A request's rotary positions when they are not its token indices (M-RoPE: Qwen2-VL and after).

Computed once when the request is built (model/mrope.py) and kept on the Req, so every forward
that touches the request (first prefill, a chunk, a retraction's re-prefill, a continuation after a
cache hit, a jump-forward's extend, decode) reads the same positions for the same token index.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MRopePositions:
    """(temporal, height, width) positions of every prompt token, and where generated tokens go on:
    token i >= len(prompt) sits at next_position + (i - len(prompt)) on each axis."""
    prompt: torch.Tensor  # [3, prompt_len] int64
    next_position: tuple[int, int, int]  # the first generated token's, per axis

    def rows(self, start: int, end: int) -> torch.Tensor:
        """Positions of token indices start .. end-1, [3, end - start] int64."""
        n = self.prompt.shape[1]
        parts = []
        if start < n:
            parts.append(self.prompt[:, start:min(end, n)])
        if end > n:
            after = torch.arange(max(start, n) - n, end - n, dtype=torch.int64)
            parts.append(after[None, :] + torch.tensor(self.next_position)[:, None])
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
