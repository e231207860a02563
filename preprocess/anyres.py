"""LLaVA-NeXT's "anyres" preprocessing: the base view plus tiles of the image at its best grid resolution.

Step for step as transformers' LlavaNextImageProcessor (PIL backend): pick the resolution of
`image_grid_pinpoints` that keeps the most of the image and wastes the least; resize the image to
fit it (aspect kept, PIL on uint8), centre it on black; cut it into tile_size squares row by row;
put in front the whole image resized to the base size; then every view goes through the usual
resize / crop / rescale / normalise. The geometry functions here are shared with the model, which
undoes the padding on the tiles' features (`unpadded_slice`), and with the token count.
"""

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from PIL import Image

from .hashing import content_hash
from .image_loader import to_rgb
from .processed import ProcessedImage
from .processing import ImageProcessing

DEFAULT_GRID_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))


def best_resolution(image_size: tuple[int, int], pinpoints) -> tuple[int, int]:
    """(height, width) of the pinpoint that shows the most pixels of the image, then wastes the fewest."""
    height, width = image_size
    best, most_shown, least_wasted = None, 0, math.inf
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        shown = min(int(width * scale) * int(height * scale), width * height)
        wasted = w * h - shown
        if shown > most_shown or (shown == most_shown and wasted < least_wasted):
            best, most_shown, least_wasted = (h, w), shown, wasted
    return best


def fit_within(image_size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """(height, width) of the image resized to fit target with its aspect ratio kept (ceil, capped)."""
    height, width = image_size
    target_h, target_w = target
    scale_w, scale_h = target_w / width, target_h / height
    if scale_w < scale_h:
        return min(math.ceil(height * scale_w), target_h), target_w
    return target_h, min(math.ceil(width * scale_h), target_w)


def unpadded_slice(image_size: tuple[int, int], rows: int, cols: int) -> tuple[slice, slice]:
    """The rows and columns of a rows x cols feature map of the padded tiles that show the image
    (the black bands the preprocessing added are cut off again)."""
    height, width = image_size
    if width / height > cols / rows:
        new_rows = int(round(height * (cols / width), 7))
        pad = (rows - new_rows) // 2
        return slice(pad, rows - pad), slice(0, cols)
    new_cols = int(round(width * (rows / height), 7))
    pad = (cols - new_cols) // 2
    return slice(0, rows), slice(pad, cols - pad)


def grid_shape(image_size: tuple[int, int], pinpoints, tile_size: int) -> tuple[int, int]:
    """Tiles down and across for an image of this (height, width)."""
    h, w = best_resolution(image_size, pinpoints)
    return h // tile_size, w // tile_size


@dataclass(frozen=True)
class AnyresProcessing:
    views: ImageProcessing  # the steps every view goes through after tiling
    grid_pinpoints: tuple[tuple[int, int], ...]
    tile_size: int
    base_size: tuple[int, int]  # (height, width) the whole image is resized to for the base view
    # OneVision: an image that shares its prompt with others is not tiled but padded to a square
    # (mean colour) and resized, one view; None: always tiled (LLaVA-NeXT)
    multi_image: ImageProcessing | None = None
    pooled_frames: bool = False  # OneVision: video frames marked for pooling (PooledVideoProcessing)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "AnyresProcessing":
        views = ImageProcessing.from_hf_config(config)
        pinpoints = tuple(tuple(int(v) for v in p) for p in config.get("image_grid_pinpoints", DEFAULT_GRID_PINPOINTS))
        size = views.resize_to or (views.shortest_edge, views.shortest_edge)
        crop = config.get("crop_size")
        tile = views.crop_size[0] if crop else size[0]
        return cls(views, pinpoints, tile, size)

    @classmethod
    def next_video_from_hf_config(cls, config: dict[str, Any]) -> "AnyresProcessing":
        """LLaVA-NeXT-Video: images as LLaVA-NeXT; frames one view each, marked for pooling."""
        return replace(cls.from_hf_config(config), pooled_frames=True)

    @classmethod
    def onevision_from_hf_config(cls, config: dict[str, Any]) -> "AnyresProcessing":
        """LlavaOnevisionImageProcessor: tiles for a lone image, a padded square view among several."""
        tiled = cls.from_hf_config(config)
        return replace(tiled, multi_image=replace(tiled.views, do_pad_to_square=True), pooled_frames=True)

    def for_image_count(self, n: int):
        return self.multi_image if n > 1 and self.multi_image is not None else self

    @property
    def mm_processor_keys(self) -> frozenset[str]:
        return self.views.mm_processor_keys

    def with_mm_kwargs(self, **kwargs) -> "AnyresProcessing":
        multi = self.multi_image.with_mm_kwargs(**kwargs) if self.multi_image is not None else None
        return replace(self, views=self.views.with_mm_kwargs(**kwargs), multi_image=multi)

    def process_frames(self, frames: list[Image.Image]) -> list[ProcessedImage]:
        return [self.process_frame(f, i == len(frames) - 1) for i, f in enumerate(frames)]

    def process_frame(self, frame: Image.Image, last: bool) -> ProcessedImage:
        """One frame of a video (processing.ImageProcessing.process_frame): never tiled."""
        if self.pooled_frames:
            return PooledVideoProcessing(self.views).process_frame(frame, last)
        return self.views.process(frame)

    def frame_role(self, last: bool) -> str:
        return PooledVideoProcessing(self.views).frame_role(last) if self.pooled_frames else "image"

    def __call__(self, image: Image.Image) -> np.ndarray:
        """float32 [1 + tiles, 3, H, W]."""
        image = to_rgb(image)
        target = best_resolution((image.height, image.width), self.grid_pinpoints)
        base = image.resize(self.base_size[::-1], resample=self.views.resample)
        views = [base] + self._tiles(image, target)
        return np.stack([self.views(v) for v in views])

    def process(self, image: Image.Image) -> ProcessedImage:
        size = (image.height, image.width)
        pixels = self(image)
        return ProcessedImage(pixels, content_hash(pixels, size), size)

    def _tiles(self, image: Image.Image, target: tuple[int, int]) -> list[Image.Image]:
        new_h, new_w = fit_within((image.height, image.width), target)
        resized = image.resize((new_w, new_h), resample=self.views.resample)
        canvas = Image.new("RGB", (target[1], target[0]), (0, 0, 0))
        canvas.paste(resized, ((target[1] - new_w) // 2, (target[0] - new_h) // 2))
        t = self.tile_size
        return [canvas.crop((x, y, x + t, y + t)) for y in range(0, target[0], t) for x in range(0, target[1], t)]


@dataclass(frozen=True)
class PooledVideoProcessing:
    """Frames of a video for a model that pools each frame's features and closes the video with one
    newline (OneVision, NeXT-Video): each frame one view; the last one marked, since it takes the
    newline too. The role is hashed in, so a video's frames key apart from the same pictures."""
    views: ImageProcessing

    def process_frames(self, frames: list[Image.Image]) -> list[ProcessedImage]:
        return [self.process_frame(f, i == len(frames) - 1) for i, f in enumerate(frames)]

    def frame_role(self, last: bool) -> str:
        return "last_frame" if last else "frame"

    def process_frame(self, frame: Image.Image, last: bool) -> ProcessedImage:
        role = self.frame_role(last)
        pixels = self.views(frame)
        return ProcessedImage(pixels, content_hash(pixels, role=role), role=role)
