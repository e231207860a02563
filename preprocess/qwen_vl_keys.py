"""Radix keys of Qwen-VL media: which pseudo-token ids a picture's or a video's positions get.

- A picture's key covers its pixels and its grid (two grids can hold the same number of patches).
- A video's keys go per temporal patch (frame pair): each covers that pair's pixels, the grid, and
  whatever else sets the KV of its tokens beside the prefix before them (Qwen2.5-VL's seconds per
  temporal patch, which scale its temporal positions). Two videos, or a clip and its extension,
  that begin with the same frames at the same size share the keys of those pairs, so the radix
  cache shares their KV and the vision cache their tower work.
- A role tag goes in first, so a still picture never shares a video patch's key even where its
  pixels (one frame repeated over the pair) equal a pair's.
"""

import numpy as np
import xxhash

from .hashing import pad_values


def _digest(role: bytes, pixels: np.ndarray, grid: tuple[int, ...], extra: bytes = b"") -> bytes:
    pixels = np.ascontiguousarray(pixels, dtype=np.float32)
    digest = xxhash.xxh3_128()
    digest.update(role)
    digest.update(np.asarray(grid, dtype=np.int64).tobytes())
    digest.update(np.asarray(pixels.shape, dtype=np.int64).tobytes())
    digest.update(extra)
    digest.update(memoryview(pixels).cast("B"))
    return digest.digest()


def image_key(pixel_values: np.ndarray, grid_thw: tuple[int, int, int]) -> bytes:
    """16 bytes (xxh3_128) over a picture's patches and its (1, grid_h, grid_w)."""
    return _digest(b"qwen-vl-image", pixel_values, grid_thw)


def video_patch_keys(pixel_values: np.ndarray, grid_thw: tuple[int, int, int],
                     second_per_grid_t: float | None = None) -> list[bytes]:
    """One 16-byte key per temporal patch: its rows of pixel_values ([t*h*w, D], pair by pair), the
    spatial grid, and Qwen2.5-VL's seconds per temporal patch where the model has one."""
    t, h, w = grid_thw
    extra = b"" if second_per_grid_t is None else np.float64(second_per_grid_t).tobytes()
    rows = h * w
    return [_digest(b"qwen-vl-video-patch", pixel_values[i * rows:(i + 1) * rows], (h, w), extra) for i in range(t)]


def placeholder_ids(key: bytes, num_tokens: int) -> list[int]:
    """The pseudo-token ids of one picture or one temporal patch (num_tokens = h*w / merge²)."""
    return pad_values(key, num_tokens)


def video_placeholder_ids(patch_keys: list[bytes], tokens_per_patch: int) -> list[list[int]]:
    """Each temporal patch's pseudo-token ids, in order (Qwen3-VL puts a timestamp between them)."""
    return [pad_values(key, tokens_per_patch) for key in patch_keys]
