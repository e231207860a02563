"""Resize / crop / rescale / normalise per a Hugging Face image-processor config (CLIP, LLaVA-1.5, SigLIP).

The arithmetic follows transformers' PIL backend step for step (PIL resize on uint8 RGB, integer
centre-crop offsets, rescale in float64 then cast to float32, normalise in float32), so the output
matches CLIPImageProcessor / LlavaImageProcessor / SiglipImageProcessor (their PIL backends) bit for bit.
"""

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from PIL import Image

from .hashing import content_hash
from .image_loader import to_rgb
from .processed import ProcessedImage

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_STANDARD_MEAN = (0.5, 0.5, 0.5)
IMAGENET_STANDARD_STD = (0.5, 0.5, 0.5)
PIL_BICUBIC = 3
MM_PROCESSOR_KEYS = frozenset({"resample"})

# What a processor class assumes for the keys its saved config leaves out (transformers' class
# attributes), by the image_processor_type prefix; CLIP's (the dataclass defaults) otherwise.
# SigLIP: resize to exactly 224x224, no centre crop, normalise with 0.5/0.5.
_CLASS_DEFAULTS = {
    "Siglip": {"size": {"height": 224, "width": 224}, "do_center_crop": False,
               "image_mean": IMAGENET_STANDARD_MEAN, "image_std": IMAGENET_STANDARD_STD},
    "LlavaOnevision": {"size": {"height": 384, "width": 384}, "do_center_crop": False},
}


@dataclass(frozen=True)
class ImageProcessing:
    do_convert_rgb: bool = True  # kept for fidelity; our output is always 3-channel RGB
    do_pad_to_square: bool = False  # LLaVA-1.5: pad to a square with the mean colour before resizing
    do_resize: bool = True
    shortest_edge: int | None = 224  # resize so the short side is this (aspect kept) ...
    resize_to: tuple[int, int] | None = None  # ... or to exactly (height, width)
    resample: int = PIL_BICUBIC
    do_center_crop: bool = True
    crop_size: tuple[int, int] = (224, 224)  # (height, width)
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD

    def __post_init__(self):
        if self.do_resize and (self.shortest_edge is None) == (self.resize_to is None):
            raise ValueError("ImageProcessing needs exactly one of shortest_edge or resize_to when do_resize")
        if self.resample not in range(6):
            raise ValueError(f"resample must be a PIL resampling code 0..5, got {self.resample}")
        if len(self.image_mean) != 3 or len(self.image_std) != 3:
            raise ValueError(f"image_mean and image_std need 3 values, got {self.image_mean} and {self.image_std}")

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "ImageProcessing":
        """From the dict in a checkpoint's preprocessor_config.json; missing keys take the defaults of
        its image_processor_type (CLIP's when it is none of _CLASS_DEFAULTS)."""
        defaults = cls()
        processor_type = config.get("image_processor_type", "LlavaImageProcessor")
        config = {**_class_defaults(processor_type), **config}
        shortest_edge, resize_to = _parse_size(config.get("size", {"shortest_edge": 224}))
        return cls(
            do_convert_rgb=bool(config.get("do_convert_rgb", True)),
            # `do_pad` means pad-to-square only on LlavaImageProcessor; elsewhere it pads a batch to
            # its largest image (LLaVA-NeXT: to the most tiles), a no-op for one image.
            do_pad_to_square=bool(config.get("do_pad", False)) and processor_type.startswith("LlavaImageProcessor"),
            do_resize=bool(config.get("do_resize", True)),
            shortest_edge=shortest_edge,
            resize_to=resize_to,
            resample=int(config.get("resample", PIL_BICUBIC)),
            do_center_crop=bool(config.get("do_center_crop", True)),
            crop_size=_parse_crop_size(config.get("crop_size") or {"height": 224, "width": 224}),  # null: no crop
            do_rescale=bool(config.get("do_rescale", True)),
            rescale_factor=float(config.get("rescale_factor", defaults.rescale_factor)),
            do_normalize=bool(config.get("do_normalize", True)),
            image_mean=_three(config.get("image_mean", OPENAI_CLIP_MEAN), "image_mean"),
            image_std=_three(config.get("image_std", OPENAI_CLIP_STD), "image_std"),
        )

    def __call__(self, image: Image.Image) -> np.ndarray:
        """float32 [3, H, W], C-contiguous."""
        image = to_rgb(image)
        if self.do_pad_to_square:
            image = pad_to_square(image, tuple(int(m * 255) for m in self.image_mean))
        if self.do_resize:
            height, width = self.output_size(image.height, image.width)
            image = image.resize((width, height), resample=self.resample)
        pixels = np.asarray(image).transpose(2, 0, 1)  # uint8 [3, H, W]
        if self.do_center_crop:
            pixels = center_crop(pixels, *self.crop_size)
        if self.do_rescale:
            pixels = (pixels.astype(np.float64) * self.rescale_factor).astype(np.float32)
        else:
            pixels = pixels.astype(np.float32)
        if self.do_normalize:
            mean = np.asarray(self.image_mean, dtype=np.float32)[:, None, None]
            std = np.asarray(self.image_std, dtype=np.float32)[:, None, None]
            pixels = (pixels - mean) / std
        return np.ascontiguousarray(pixels, dtype=np.float32)

    def process(self, image: Image.Image) -> ProcessedImage:
        pixels = self(image)
        return ProcessedImage(pixels, content_hash(pixels))

    @property
    def mm_processor_keys(self) -> frozenset[str]:
        """The mm_processor_kwargs a request may give (transformers' call-time kwargs that keep the
        tower's input shape: every CLIP / SigLIP / LLaVA image processor takes `resample`)."""
        return MM_PROCESSOR_KEYS

    def with_mm_kwargs(self, **kwargs) -> "ImageProcessing":
        """This processing with a request's mm_processor_kwargs; ValueError names a bad value."""
        resample = kwargs.get("resample", self.resample)
        if not isinstance(resample, int) or isinstance(resample, bool):
            raise ValueError(f"resample must be a PIL resampling code 0..5, got {resample!r}")
        return replace(self, **kwargs)

    def for_image_count(self, n: int) -> "ImageProcessing":
        """The processing for each image of a prompt with n images (the same, whatever n)."""
        return self

    def process_frames(self, frames: list[Image.Image]) -> list[ProcessedImage]:
        """A video's sampled frames, each as a picture."""
        return [self.process_frame(f, i == len(frames) - 1) for i, f in enumerate(frames)]

    def process_frame(self, frame: Image.Image, last: bool) -> ProcessedImage:
        """One frame of a video: a function of its pixels and its role alone (preprocess/frame_cache.py
        keys a processed frame by these)."""
        return self.process(frame)

    def frame_role(self, last: bool) -> str:
        """The role process_frame gives a video's frame (the last one or another)."""
        return "image"

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after resizing; with shortest_edge the long side is truncated, as transformers does."""
        if self.resize_to is not None:
            return self.resize_to
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.shortest_edge, int(self.shortest_edge * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)


def _class_defaults(processor_type: str) -> dict[str, Any]:
    return next((d for prefix, d in _CLASS_DEFAULTS.items() if processor_type.startswith(prefix)), {})


def pad_to_square(image: Image.Image, fill: tuple[int, int, int]) -> Image.Image:
    width, height = image.size
    if width == height:
        return image
    side = max(width, height)
    square = Image.new("RGB", (side, side), fill)
    square.paste(image, ((side - width) // 2, (side - height) // 2))
    return square


def center_crop(pixels: np.ndarray, crop_height: int, crop_width: int) -> np.ndarray:
    """Crop [C, H, W] about the centre; a side smaller than the crop is zero-padded (transformers' rule)."""
    _, height, width = pixels.shape
    top, left = (height - crop_height) // 2, (width - crop_width) // 2
    if top >= 0 and left >= 0:
        return pixels[:, top:top + crop_height, left:left + crop_width]
    new_height, new_width = max(crop_height, height), max(crop_width, width)
    padded = np.zeros((pixels.shape[0], new_height, new_width), dtype=pixels.dtype)
    pad_top, pad_left = -(-(new_height - height) // 2), -(-(new_width - width) // 2)
    padded[:, pad_top:pad_top + height, pad_left:pad_left + width] = pixels
    top, left = (new_height - crop_height) // 2, (new_width - crop_width) // 2
    return padded[:, top:top + crop_height, left:left + crop_width]


def _parse_size(size: Any) -> tuple[int | None, tuple[int, int] | None]:
    if isinstance(size, int):
        return size, None
    if isinstance(size, dict):
        if "shortest_edge" in size and "longest_edge" not in size:
            return int(size["shortest_edge"]), None
        if "height" in size and "width" in size:
            return None, (int(size["height"]), int(size["width"]))
    raise ValueError(f"unsupported image processor size {size!r}: "
                     "give an int, {'shortest_edge': N} or {'height': H, 'width': W}")


def _parse_crop_size(crop: Any) -> tuple[int, int]:
    if isinstance(crop, int):
        return crop, crop
    if isinstance(crop, dict) and "height" in crop and "width" in crop:
        return int(crop["height"]), int(crop["width"])
    raise ValueError(f"unsupported crop_size {crop!r}: give an int or {{'height': H, 'width': W}}")


def _three(values: Any, name: str) -> tuple[float, float, float]:
    if isinstance(values, (int, float)):
        values = [values] * 3
    if len(values) != 3:
        raise ValueError(f"{name} needs 3 values (RGB), got {values!r}")
    return tuple(float(v) for v in values)
