"""Radix keys of Qwen-VL media: the content hashes whose pseudo-token ids (hashing.pad_values) a
picture's or a video's positions get.

- A picture's key covers its pixels and grid: its pixels are kept as [1, grid_h, grid_w, D], and the
  content hash takes the shape in.
- A video's keys go per temporal patch (frame pair): each covers that pair's pixels and grid, and
  whatever else sets its tokens' KV beside the prefix before them (Qwen2.5-VL's seconds per
  temporal patch, which scale its temporal positions). Two videos, or a clip and its extension,
  that begin with the same frames at the same size share the keys of those pairs, so the radix
  cache shares their KV and the vision cache their tower work (the Qwen towers attend within a
  temporal patch, so a pair's embedding does not depend on the others).
- The role goes in, so a still picture never shares a video patch's key even where its pixels (one
  frame repeated over the pair) equal a pair's.
"""

import numpy as np

from .hashing import content_hash

VIDEO_PATCH = "video_patch"


def image_key(pixel_values: np.ndarray) -> bytes:
    """A picture's key: its pixels [1, grid_h, grid_w, D], shape included."""
    return content_hash(pixel_values)


def video_patch_key(pixel_values: np.ndarray, second_per_grid_t: float | None = None) -> bytes:
    """One temporal patch's key: its pixels [1, grid_h, grid_w, D], the role, and Qwen2.5-VL's
    seconds per temporal patch where the model has one."""
    role = VIDEO_PATCH if second_per_grid_t is None else f"{VIDEO_PATCH}@{float(second_per_grid_t)!r}s"
    return content_hash(pixel_values, role=role)
