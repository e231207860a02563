"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL pictures: native-resolution resize and patching, pixel for pixel
as transformers' Qwen2VLImageProcessor (its torchvision backend, the one AutoProcessor builds).

- `smart_resize`: each side to a multiple of patch_size * merge_size (28; 32 for Qwen3-VL), the
  area brought within [min_pixels, max_pixels], the aspect ratio kept as closely as that allows.
- The resize is `torch.nn.functional.interpolate(mode="bicubic", antialias=True)` on the uint8
  image, which is what torchvision's resize runs on a CPU uint8 tensor (PIL's bicubic differs by
  one level on about 0.5% of pixels).
- Rescale and normalise fused as transformers fuses them: (x - mean*255) / (std*255) in float32.
- Patches flattened into transformers' `pixel_values` rows, C*T*p*p each, in 2x2 merge groups, the
  picture repeated over the temporal patch. A picture's rows are kept as [1, grid_h, grid_w, C*T*p*p]
  (`.reshape(-1, D)` gives transformers' rows): the shape is `image_grid_thw`, so the content hash
  covers the grid. The decoder sees grid_h*grid_w / merge² tokens.

Videos (frame pairs, timestamps) are in qwen_vl_video.py, radix keys in qwen_vl_keys.py.
"""

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from PIL import Image

from .errors import MediaError
from .image_loader import to_rgb
from .processing import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PIL_BICUBIC

MAX_ASPECT_RATIO = 200
# Qwen2VLImageProcessor's class defaults, for the keys a saved config leaves out
DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 1280


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = DEFAULT_MIN_PIXELS,
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[int, int]:
    """(height, width), each a multiple of factor, with min_pixels <= area <= max_pixels where the
    rounding allows (transformers' rule, including its max(factor, ...) floor)."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaError(f"image aspect ratio must be at most {MAX_ASPECT_RATIO}:1 for this model, "
                         f"got {width}x{height}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def as_uint8_tensor(images: list[Image.Image]) -> torch.Tensor:
    """RGB pictures of one size as uint8 [N, 3, H, W] (channels-last in memory, as transformers has them)."""
    arrays = np.stack([np.asarray(to_rgb(image)) for image in images])
    return torch.from_numpy(arrays).permute(0, 3, 1, 2)


def resize_uint8(pixels: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """uint8 [N, 3, H, W] → uint8 [N, 3, height, width] by antialiased bicubic; unchanged if the size is."""
    if tuple(pixels.shape[-2:]) == (height, width):
        return pixels
    return torch.nn.functional.interpolate(pixels, size=(height, width), mode="bicubic", align_corners=False,
                                           antialias=True)


def patchify(frames: torch.Tensor, patch_size: int, merge_size: int, temporal_patch_size: int) -> torch.Tensor:
    """float32 [T, C, H, W] (T a multiple of temporal_patch_size) → [t*grid_h*grid_w, C*Tp*p*p] in
    transformers' order: temporal patch, merge group row, merge group column, the 2x2 within it."""
    t, channels, height, width = frames.shape
    grid_t, grid_h, grid_w = t // temporal_patch_size, height // patch_size, width // patch_size
    patches = frames.reshape(grid_t, temporal_patch_size, channels, grid_h // merge_size, merge_size, patch_size,
                             grid_w // merge_size, merge_size, patch_size)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return patches.reshape(grid_t * grid_h * grid_w, channels * temporal_patch_size * patch_size * patch_size)


def patch_grid(rows: torch.Tensor, grid_thw: tuple[int, int, int]) -> np.ndarray:
    """transformers' rows [t*h*w, D] as float32 C-contiguous [t, h, w, D]."""
    return np.ascontiguousarray(rows.reshape(*grid_thw, rows.shape[-1]).numpy(), dtype=np.float32)


@dataclass(frozen=True)
class QwenVLImage:
    """A picture, or one temporal patch (frame pair) of a video, ready for the tower: a ProcessedImage
    (pixel_values, content_hash, image_size, role) whose pixels' shape is its grid."""
    pixel_values: np.ndarray  # float32 [1, grid_h, grid_w, C*T*p*p], C-contiguous, in transformers' row order
    content_hash: bytes  # its radix key (qwen_vl_keys): pixels, grid, role
    image_size: tuple[int, int]  # (height, width) before processing
    num_tokens: int  # grid_h*grid_w / merge²: the decoder's positions for it
    role: str = "image"  # or VIDEO_PATCH
    second_per_grid_t: float | None = None  # a Qwen2.5-VL video patch: the seconds it spans (its positions scale)
    timestamp: float | None = None  # a Qwen3-VL video patch: its time in seconds, written before it

    @property
    def grid_thw(self) -> tuple[int, int, int]:
        t, h, w, _ = self.pixel_values.shape
        return t, h, w

    @property
    def rows(self) -> np.ndarray:
        """transformers' pixel_values rows, [grid_h*grid_w, C*T*p*p]."""
        return self.pixel_values.reshape(-1, self.pixel_values.shape[-1])


@dataclass(frozen=True)
class QwenVLProcessing:
    """A Qwen-VL image processor's settings (preprocessor_config.json); hashable, as a processing
    keying the processed-image cache must be. with_pixels() gives a request's own min/max_pixels."""
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = DEFAULT_MIN_PIXELS
    max_pixels: int = DEFAULT_MAX_PIXELS
    do_resize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD

    def __post_init__(self):
        check_pixel_bounds(self.min_pixels, self.max_pixels)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "QwenVLProcessing":
        """From preprocessor_config.json: `min_pixels`/`max_pixels` (Qwen2-VL, Qwen2.5-VL) override
        `size` {shortest_edge, longest_edge} (Qwen3-VL), as the processor's __init__ does."""
        resample = int(config.get("resample", PIL_BICUBIC))
        if resample != PIL_BICUBIC:
            raise ValueError(f"Qwen-VL processing resizes by bicubic (resample=3); the config asks for {resample}")
        min_pixels, max_pixels = pixel_bounds(config, DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS)
        defaults = cls()
        return cls(patch_size=int(config.get("patch_size", defaults.patch_size)),
                   merge_size=int(config.get("merge_size", defaults.merge_size)),
                   temporal_patch_size=int(config.get("temporal_patch_size", defaults.temporal_patch_size)),
                   min_pixels=min_pixels, max_pixels=max_pixels, do_resize=bool(config.get("do_resize", True)),
                   do_rescale=bool(config.get("do_rescale", True)),
                   rescale_factor=float(config.get("rescale_factor", defaults.rescale_factor)),
                   do_normalize=bool(config.get("do_normalize", True)),
                   image_mean=_three(config.get("image_mean", OPENAI_CLIP_MEAN)),
                   image_std=_three(config.get("image_std", OPENAI_CLIP_STD)))

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def with_pixels(self, min_pixels: int | None = None, max_pixels: int | None = None) -> "QwenVLProcessing":
        """This processing with a request's own bounds (mm_processor_kwargs min_pixels / max_pixels)."""
        for name, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise MediaError(f"{name} must be a positive integer, got {value!r}")
        return replace(self, min_pixels=self.min_pixels if min_pixels is None else min_pixels,
                       max_pixels=self.max_pixels if max_pixels is None else max_pixels)

    def with_processor_kwargs(self, kwargs: dict[str, Any]) -> "QwenVLProcessing":
        """With a request's mm_processor_kwargs: min_pixels / max_pixels, or transformers' `size`
        {shortest_edge, longest_edge}; any other key is refused by name."""
        return self.with_pixels(*request_pixel_bounds(kwargs))

    @property
    def mm_processor_keys(self) -> frozenset[str]:
        """The mm_processor_kwargs a request may give (preprocess/media_options.py)."""
        return frozenset(PIXEL_KWARGS)

    def with_mm_kwargs(self, **kwargs) -> "QwenVLProcessing":
        return self.with_processor_kwargs(kwargs)

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        if not self.do_resize:
            return height, width
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """(1, grid_h, grid_w) for a picture of this size."""
        h, w = self.output_size(height, width)
        return 1, h // self.patch_size, w // self.patch_size

    def num_tokens(self, height: int, width: int) -> int:
        """The decoder's positions for a picture of this size: t*h*w / merge²."""
        t, h, w = self.grid_thw(height, width)
        return t * h * w // self.merge_size ** 2

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 [..., 3, H, W] → float32, rescaled and normalised in one step as transformers does."""
        x = pixels.to(torch.float32)
        if self.do_normalize:
            scale = 1.0 / self.rescale_factor if self.do_rescale else 1.0
            mean = torch.tensor(self.image_mean) * scale
            std = torch.tensor(self.image_std) * scale
            return (x - mean[:, None, None]) / std[:, None, None]
        return x * self.rescale_factor if self.do_rescale else x

    def process(self, image: Image.Image) -> QwenVLImage:
        from .qwen_vl_keys import image_key

        pixels = as_uint8_tensor([image])
        height, width = pixels.shape[-2:]
        new_h, new_w = self.output_size(height, width)
        self._check_divisible(new_h, new_w)
        frames = self.normalize(resize_uint8(pixels, new_h, new_w))
        # a picture fills every temporal slot of its one temporal patch
        frames = frames.expand(self.temporal_patch_size, -1, -1, -1)
        values = patch_grid(patchify(frames, self.patch_size, self.merge_size, self.temporal_patch_size),
                            (1, new_h // self.patch_size, new_w // self.patch_size))
        return QwenVLImage(values, image_key(values), (int(height), int(width)), self.tokens_for(values))

    def tokens_for(self, pixel_values: np.ndarray) -> int:
        t, h, w, _ = pixel_values.shape
        return t * h * w // self.merge_size ** 2

    def for_image_count(self, n: int) -> "QwenVLProcessing":
        return self

    def _check_divisible(self, height: int, width: int) -> None:
        if height % self.factor or width % self.factor:
            raise MediaError(f"with do_resize off a picture's sides must be multiples of {self.factor}; "
                             f"got {width}x{height}")


PIXEL_KWARGS = ("min_pixels", "max_pixels", "size")


def request_pixel_bounds(kwargs: dict[str, Any]) -> tuple[int | None, int | None]:
    """(min_pixels, max_pixels) a request's mm_processor_kwargs ask for (None: the checkpoint's)."""
    unknown = sorted(set(kwargs) - set(PIXEL_KWARGS))
    if unknown:
        raise MediaError(f"mm_processor_kwargs {unknown} are not taken by this model's processor; "
                         f"it takes {list(PIXEL_KWARGS)}")
    size = kwargs.get("size") or {}
    if not isinstance(size, dict) or set(size) - {"shortest_edge", "longest_edge"}:
        raise MediaError(f"size must be {{'shortest_edge': N, 'longest_edge': N}}, got {size!r}")
    return (kwargs.get("min_pixels", size.get("shortest_edge")), kwargs.get("max_pixels", size.get("longest_edge")))


def pixel_bounds(config: dict[str, Any], default_min: int, default_max: int) -> tuple[int, int]:
    """(min_pixels, max_pixels) of a Qwen image or video processor config: the top-level keys, else
    `size` (shortest_edge / longest_edge, or the older min_pixels / max_pixels in it), else the defaults."""
    size = config.get("size") or {}
    lo = config.get("min_pixels", size.get("shortest_edge", size.get("min_pixels", default_min)))
    hi = config.get("max_pixels", size.get("longest_edge", size.get("max_pixels", default_max)))
    return int(lo), int(hi)


def check_pixel_bounds(min_pixels: int, max_pixels: int) -> None:
    if min_pixels < 1 or max_pixels < 1 or min_pixels > max_pixels:
        raise MediaError(f"need 1 <= min_pixels <= max_pixels, got min_pixels={min_pixels}, max_pixels={max_pixels}")


def _three(values: Any) -> tuple[float, float, float]:
    values = [values] * 3 if isinstance(values, (int, float)) else list(values)
    if len(values) != 3:
        raise ValueError(f"image_mean / image_std need 3 values (RGB), got {values!r}")
    return tuple(float(v) for v in values)
