"""Qwen-VL videos: sampled frames resized, paired and patched as transformers' Qwen2VLVideoProcessor
(Qwen2-VL, Qwen2.5-VL) and Qwen3VLVideoProcessor do, pixel for pixel.

- `sample_indices`: which frames of the source each model's processor samples (Qwen2-VL and
  Qwen2.5-VL: none unless asked, every total/n-th; Qwen3-VL: 2 per second by default, spread evenly).
- Every frame is resized to one size: Qwen2-VL and Qwen2.5-VL bound each frame by max_pixels;
  Qwen3-VL bounds all frames together (t * h * w), so a longer clip gets smaller frames.
  `cap_pixels_per_frame` (off unless the config sets it) applies either's reference per-frame cap.
- Frames go in pairs (temporal_patch_size 2); an odd count repeats its last frame.
  `video_grid_thw` = (pairs, grid_h, grid_w).
- Qwen2.5-VL: `second_per_grid_ts` = temporal_patch_size / sampled fps (its temporal positions
  scale with it). Qwen3-VL: each pair's timestamp, the mean of its two frames' times, written
  before the pair as `<t.t seconds>`.
"""

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from PIL import Image

from .errors import MediaError
from .processing import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from .qwen_vl import (
    MAX_ASPECT_RATIO, QwenVLImage, QwenVLProcessing, as_uint8_tensor, check_pixel_bounds, patch_grid, patchify,
    pixel_bounds, resize_uint8, smart_resize,
)
from .qwen_vl_keys import VIDEO_PATCH, video_patch_key
from .video import SampledVideo

QWEN2_VL, QWEN2_5_VL, QWEN3_VL = "qwen2_vl", "qwen2_5_vl", "qwen3_vl"  # transformers' model_type
DEFAULT_FPS = 24  # what transformers assumes of a video whose fps is unknown


@dataclass(frozen=True)
class _VideoDefaults:
    min_pixels: int
    max_pixels: int
    patch_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    max_video_tokens: int
    fps: float | None  # frames sampled per second when the request names neither num_frames nor fps


# the video processor classes' defaults, for keys a saved config leaves out
_DEFAULTS = {
    QWEN2_VL: _VideoDefaults(128 * 28 * 28, 28 * 28 * 768, 14, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, 128000, None),
    QWEN3_VL: _VideoDefaults(128 * 32 * 32, 32 * 32 * 768, 16, IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, 768, 2),
}


@dataclass(frozen=True)
class QwenVLVideo:
    """One video ready for the tower: its temporal patches (frame pairs), each a QwenVLImage of role
    VIDEO_PATCH with its own radix key, which the tower embeds on its own."""
    patches: tuple[QwenVLImage, ...]
    second_per_grid_t: float | None  # Qwen2.5-VL: seconds per pair; None elsewhere
    timestamps: tuple[float, ...] | None  # Qwen3-VL: each pair's time in seconds; None elsewhere

    @property
    def grid_thw(self) -> tuple[int, int, int]:
        """transformers' video_grid_thw: (pairs, grid_h, grid_w)."""
        _, h, w = self.patches[0].grid_thw
        return len(self.patches), h, w

    @property
    def pixel_values(self) -> np.ndarray:
        """transformers' pixel_values_videos rows, [pairs*grid_h*grid_w, C*T*p*p]."""
        return np.concatenate([p.rows for p in self.patches])

    @property
    def patch_keys(self) -> tuple[bytes, ...]:
        return tuple(p.content_hash for p in self.patches)

    @property
    def tokens_per_patch(self) -> int:
        return self.patches[0].num_tokens

    @property
    def num_tokens(self) -> int:
        return sum(p.num_tokens for p in self.patches)


def timestamp_text(seconds: float) -> str:
    """The text Qwen3-VL writes before each frame pair."""
    return f"<{seconds:.1f} seconds>"


@dataclass(frozen=True)
class QwenVLVideoProcessing:
    model_type: str  # QWEN2_VL, QWEN2_5_VL or QWEN3_VL
    frames: QwenVLProcessing  # patching and normalisation; its min/max_pixels bound the video
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 128000
    fps: float | None = None  # the processor's own sampling rate (Qwen3-VL: 2)
    min_frames: int = 4
    max_frames: int = 768

    @classmethod
    def from_hf_config(cls, model_type: str, config: dict[str, Any]) -> "QwenVLVideoProcessing":
        """config: video_preprocessor_config.json where the checkpoint has one, else its
        preprocessor_config.json (Qwen2-VL and Qwen2.5-VL videos inherit the image settings)."""
        if model_type not in (QWEN2_VL, QWEN2_5_VL, QWEN3_VL):
            raise ValueError(f"not a Qwen-VL model_type: {model_type!r}")
        d = _DEFAULTS[QWEN3_VL if model_type == QWEN3_VL else QWEN2_VL]
        min_pixels, max_pixels = pixel_bounds(config, d.min_pixels, d.max_pixels)
        frames = QwenVLProcessing.from_hf_config({"patch_size": d.patch_size, "image_mean": d.mean, "image_std": d.std,
                                                  **config, "min_pixels": min_pixels, "max_pixels": max_pixels})
        fps = config.get("fps", d.fps)
        return cls(model_type, frames, bool(config.get("cap_pixels_per_frame") or False),
                   int(config.get("max_video_tokens", d.max_video_tokens)), None if fps is None else float(fps),
                   int(config.get("min_frames", 4)), int(config.get("max_frames", 768)))

    def with_pixels(self, min_pixels: int | None = None, max_pixels: int | None = None) -> "QwenVLVideoProcessing":
        return replace(self, frames=self.frames.with_pixels(min_pixels, max_pixels))

    def with_processor_kwargs(self, kwargs: dict[str, Any]) -> "QwenVLVideoProcessing":
        """With a request's mm_processor_kwargs (min_pixels / max_pixels / size), as for pictures."""
        return replace(self, frames=self.frames.with_processor_kwargs(kwargs))

    @property
    def mm_processor_keys(self) -> frozenset[str]:
        return self.frames.mm_processor_keys

    def with_mm_kwargs(self, **kwargs) -> "QwenVLVideoProcessing":
        return self.with_processor_kwargs(kwargs)

    def sample_indices(self, total_frames: int, source_fps: float | None, num_frames: int | None = None,
                       fps: float | None = None) -> list[int]:
        """The source frames this model's video processor samples (its sample_frames) for a request's
        num_frames or fps, else for its own fps (Qwen3-VL: 2 a second; Qwen2-VL: every frame)."""
        if num_frames is not None and fps is not None:
            raise MediaError(f"give either num_frames or fps, not both (num_frames={num_frames}, fps={fps})")
        if total_frames < 1:
            raise MediaError("video has no frames")
        if self.model_type == QWEN3_VL:
            return _qwen3_indices(self, total_frames, source_fps, num_frames, fps)
        return _qwen2_indices(self, total_frames, source_fps, num_frames, fps)

    def output_size(self, num_frames: int, height: int, width: int) -> tuple[int, int]:
        """(height, width) of every frame of a video of num_frames sampled frames."""
        f = self.frames
        check_pixel_bounds(f.min_pixels, f.max_pixels)
        if self.model_type == QWEN3_VL:
            return _qwen3_size(num_frames, height, width, f.temporal_patch_size, f.factor, f.min_pixels,
                               self._qwen3_max_pixels(num_frames))
        return smart_resize(height, width, f.factor, f.min_pixels, self._qwen2_max_pixels(num_frames))

    def _qwen2_max_pixels(self, num_frames: int) -> int:
        f = self.frames
        if not self.cap_pixels_per_frame:
            return f.max_pixels
        total = int(self.max_video_tokens * f.factor * f.factor * 0.9)
        return max(min(f.max_pixels, total * f.temporal_patch_size // num_frames), int(f.min_pixels * 1.05))

    def _qwen3_max_pixels(self, num_frames: int) -> int:
        f = self.frames
        if not self.cap_pixels_per_frame:
            return f.max_pixels
        per_frame = max(min(self.max_video_tokens * f.factor * f.factor, f.max_pixels // num_frames),
                        int(f.min_pixels * 1.05))
        return per_frame * num_frames

    def grid_thw(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        h, w = self.output_size(num_frames, height, width)
        p, tp = self.frames.patch_size, self.frames.temporal_patch_size
        return math.ceil(num_frames / tp), h // p, w // p

    def num_tokens(self, num_frames: int, height: int, width: int) -> int:
        t, h, w = self.grid_thw(num_frames, height, width)
        return t * h * w // self.frames.merge_size ** 2

    def process_video(self, frames: list[Image.Image], frame_indices: list[int] | None = None,
                      source_fps: float | None = None, total_frames: int | None = None) -> QwenVLVideo:
        """frames: the sampled frames, in order; frame_indices: their indices in the source video
        (default 0..n-1), source_fps its frame rate, total_frames its length (for the sampled fps)."""
        if not frames:
            raise MediaError("a video needs at least one frame")
        f = self.frames
        pixels = as_uint8_tensor(frames) if len({im.size for im in frames}) == 1 else _same_size_error(frames)
        height, width = pixels.shape[-2:]
        new_h, new_w = self.output_size(len(frames), height, width)
        normalized = f.normalize(resize_uint8(pixels, new_h, new_w))
        if pad := -len(frames) % f.temporal_patch_size:  # an odd count repeats its last frame
            normalized = torch.cat([normalized, normalized[-1:].expand(pad, -1, -1, -1)])
        grid = (normalized.shape[0] // f.temporal_patch_size, new_h // f.patch_size, new_w // f.patch_size)
        pairs = patch_grid(patchify(normalized, f.patch_size, f.merge_size, f.temporal_patch_size), grid)
        indices = list(range(len(frames))) if frame_indices is None else list(frame_indices)
        if len(indices) != len(frames):
            raise ValueError(f"{len(frames)} frames but {len(indices)} frame indices")
        seconds = (f.temporal_patch_size / sampled_fps(len(indices), source_fps, total_frames)
                   if self.model_type == QWEN2_5_VL else None)
        stamps = (tuple(pair_timestamps(indices, source_fps, f.temporal_patch_size))
                  if self.model_type == QWEN3_VL else None)
        size = (int(height), int(width))
        patches = tuple(QwenVLImage(pair[None], video_patch_key(pair[None], seconds), size, f.tokens_for(pair[None]),
                                    VIDEO_PATCH, seconds, None if stamps is None else stamps[i])
                        for i, pair in enumerate(pairs))
        return QwenVLVideo(patches, seconds, stamps)

    def process_sampled(self, video: SampledVideo) -> list[QwenVLImage]:
        """A video read by video.read_video as its temporal patches, each carrying its seconds
        (Qwen2.5-VL) or timestamp (Qwen3-VL): what prepare_video and the processed-media cache keep."""
        return list(process_sampled_video(self, video).patches)


def _qwen2_indices(p: QwenVLVideoProcessing, total: int, source_fps: float | None, num_frames: int | None,
                   fps: float | None) -> list[int]:
    """Qwen2VLVideoProcessor.sample_frames: a multiple of temporal_patch_size frames, every total/n-th."""
    tp = p.frames.temporal_patch_size
    fps = fps if fps is not None or num_frames is not None else p.fps
    if num_frames is not None:
        num_frames = round(num_frames / tp) * tp
    elif fps is not None:
        if source_fps is None:
            raise MediaError("sampling by fps needs the video's frame rate, which it does not report")
        most = math.floor(min(p.max_frames, total) / tp) * tp
        num_frames = math.floor(min(max(total / source_fps * fps, p.min_frames), most, total) / tp) * tp
    if num_frames is None:
        return list(range(total))
    if not 0 < num_frames <= total:
        raise MediaError(f"cannot sample {num_frames} frames (in pairs) from a video of {total} frames")
    return torch.arange(0, total, total / num_frames).int().tolist()


def _qwen3_indices(p: QwenVLVideoProcessing, total: int, source_fps: float | None, num_frames: int | None,
                   fps: float | None) -> list[int]:
    """Qwen3VLVideoProcessor.sample_frames: n frames spread evenly over [0, total-1], n from the fps
    (at least min_frames, at most max_frames and the video's length) unless given."""
    fps = fps if fps is not None else p.fps
    if num_frames is None and fps is not None:
        per_second = source_fps or DEFAULT_FPS
        num_frames = min(max(int(total / per_second * fps), p.min_frames), p.max_frames, total)
    if num_frames is None:
        num_frames = min(max(total, p.min_frames), p.max_frames)
    if num_frames < 1:
        raise MediaError(f"num_frames must be a positive integer, got {num_frames}")
    return np.linspace(0, total - 1, num_frames).round().astype(int).tolist()


def process_sampled_video(processing: QwenVLVideoProcessing, video: SampledVideo) -> QwenVLVideo:
    """A video read by video.read_video (its frames and where they came from)."""
    info = video.info
    return processing.process_video(video.frames, list(info.frame_indices) or None, info.source_fps,
                                    info.total_frames)


def sampled_fps(num_sampled: int, source_fps: float | None, total_frames: int | None) -> float:
    """transformers' VideoMetadata.sampled_fps: frames kept per second of the source."""
    if source_fps is None or total_frames is None:
        return source_fps or DEFAULT_FPS
    return num_sampled / total_frames * source_fps


def pair_timestamps(frame_indices: list[int], source_fps: float | None, temporal_patch_size: int = 2) -> list[float]:
    """Each frame pair's time in seconds: the mean of its first and last frame's (the last frame
    repeated to fill the last pair), as transformers' Qwen3VLProcessor computes it."""
    fps = source_fps or DEFAULT_FPS
    indices = list(frame_indices)
    if pad := -len(indices) % temporal_patch_size:
        indices += [indices[-1]] * pad
    times = [i / fps for i in indices]
    return [(times[i] + times[i + temporal_patch_size - 1]) / 2 for i in range(0, len(times), temporal_patch_size)]


def _qwen3_size(num_frames: int, height: int, width: int, temporal_factor: int, factor: int, min_pixels: int,
                max_pixels: int) -> tuple[int, int]:
    """Qwen3-VL's smart_resize: the pixel budget is over all frames (t * h * w) together."""
    if num_frames < temporal_factor:
        raise MediaError(f"a Qwen3-VL video needs at least {temporal_factor} frames, got {num_frames}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaError(f"video aspect ratio must be at most {MAX_ASPECT_RATIO}:1 for this model, "
                         f"got {width}x{height}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(num_frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _same_size_error(frames: list[Image.Image]):
    sizes = sorted({im.size for im in frames})
    raise MediaError(f"a video's frames must all have one size, got {sizes}")
