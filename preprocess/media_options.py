"""A request's media options, with vLLM's names: how its videos are sampled (`media_io_kwargs`) and
the keyword arguments its images go through the model's processor with (`mm_processor_kwargs`).

    media_io_kwargs     {"video": {"num_frames": N, "fps": F, "max_frames": M}}
    mm_processor_kwargs {KEY: VALUE} for a KEY the model's processing object lists in
                        `mm_processor_keys` (its `with_mm_kwargs(**kw)` makes the processing with them)

One set of rules behind every route: /generate's `video_num_frames` / `video_fps` and /upload's
`num_frames` / `fps` are aliases of media_io_kwargs.video's num_frames / fps. Every value is checked
here and a bad one raises MediaError whose `param` names it (the HTTP layer's 400). The options are
frozen and hashable: they key the processed-media cache, and what they change (frames, pixels)
changes the content hashes, so two requests share radix keys only where the pixels are the same.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from .errors import MediaError

INT32_END = 2**31
FLOAT32_MAX = 3.4028234663852886e38
VIDEO_IO_KEYS = ("num_frames", "fps", "max_frames")


class MediaOptionError(MediaError):
    """A media option with a bad value; `param` names the field (as the request spelt it)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class VideoSampling:
    """Which frames of a video the model sees.

    num_frames: that many, spread evenly from the first frame to the last.
    fps: one frame every 1/fps seconds from t=0 (fixed timestamps: a longer clip of the same video
        starts with the same frames). With max_frames, a clip that would give more frames keeps every
        k-th of them, the smallest k that fits: still on the same timestamps, still covering the clip.
    Neither: the server's default num_frames (--video-frames).
    """
    num_frames: int | None = None
    fps: float | None = None
    max_frames: int | None = None

    def with_default(self, num_frames: int) -> "VideoSampling":
        if self.num_frames is None and self.fps is None:
            return VideoSampling(num_frames, None, self.max_frames)
        return self

    def indices(self, total: int, source_fps: float) -> list[int]:
        """Frame indices to decode, in order, for a video of `total` frames at `source_fps`."""
        if self.fps is not None:
            step = source_fps / self.fps
            grid = (list(range(total)) if step <= 1
                    else [int(k * step) for k in range(math.ceil(total / step))])
            if self.max_frames is not None and len(grid) > self.max_frames:
                grid = grid[::math.ceil(len(grid) / self.max_frames)]
            return grid
        count = min(self.num_frames, self.max_frames or self.num_frames)
        if count >= total:
            return list(range(total))
        return [int(i) for i in np.linspace(0, total - 1, count).round()]


@dataclass(frozen=True)
class MediaOptions:
    video: VideoSampling = VideoSampling()
    processor_kwargs: tuple[tuple[str, object], ...] = field(default=())  # sorted (key, value) pairs

    @classmethod
    def parse(cls, media_io_kwargs=None, mm_processor_kwargs=None, video_num_frames=None,
              video_fps=None) -> "MediaOptions":
        """The options of a request: vLLM's two fields, and the aliases video_num_frames / video_fps."""
        video = _video_io(media_io_kwargs)
        num_frames = _alias(video.get("num_frames"), video_num_frames, "num_frames", "video_num_frames")
        fps = _alias(video.get("fps"), video_fps, "fps", "video_fps")
        sampling = VideoSampling(
            _count(num_frames, "media_io_kwargs.video.num_frames" if "num_frames" in video else "video_num_frames"),
            _rate(fps, "media_io_kwargs.video.fps" if "fps" in video else "video_fps"),
            _count(video.get("max_frames"), "media_io_kwargs.video.max_frames"))
        if sampling.num_frames is not None and sampling.fps is not None:
            raise MediaOptionError(f"media_io_kwargs.video: give either num_frames or fps, not both "
                                   f"(num_frames={sampling.num_frames}, fps={sampling.fps})", "media_io_kwargs.video")
        return cls(sampling, _processor_kwargs(mm_processor_kwargs))

    def processing_for(self, processing):
        """The model's processing with this request's mm_processor_kwargs (itself when there are none)."""
        if not self.processor_kwargs:
            return processing
        accepted = getattr(processing, "mm_processor_keys", frozenset())
        for key, _ in self.processor_kwargs:
            if key not in accepted:
                takes = ", ".join(sorted(accepted)) or "no keys"
                raise MediaOptionError(f"mm_processor_kwargs.{key} is not a key this model's processor takes "
                                       f"(it takes {takes})", f"mm_processor_kwargs.{key}")
        try:
            return processing.with_mm_kwargs(**dict(self.processor_kwargs))
        except MediaError:
            raise
        except ValueError as e:
            raise MediaOptionError(f"mm_processor_kwargs: {e}", "mm_processor_kwargs") from None


def _video_io(media_io_kwargs) -> dict:
    if media_io_kwargs is None:
        return {}
    if not isinstance(media_io_kwargs, dict):
        raise MediaOptionError("media_io_kwargs must be an object such as {\"video\": {\"num_frames\": 8}}",
                               "media_io_kwargs")
    for modality in media_io_kwargs:
        if modality != "video":
            raise MediaOptionError(f"media_io_kwargs.{modality} is not supported: only \"video\" takes options",
                                   f"media_io_kwargs.{modality}")
    video = media_io_kwargs.get("video") or {}
    if not isinstance(video, dict):
        raise MediaOptionError("media_io_kwargs.video must be an object with num_frames, fps or max_frames",
                               "media_io_kwargs.video")
    for key in video:
        if key not in VIDEO_IO_KEYS:
            raise MediaOptionError(f"media_io_kwargs.video.{key} is not a video option (take num_frames, fps or "
                                   "max_frames)", f"media_io_kwargs.video.{key}")
    return video


def _alias(value, alias_value, name: str, alias: str):
    if value is not None and alias_value is not None and value != alias_value:
        raise MediaOptionError(f"media_io_kwargs.video.{name}={value!r} and {alias}={alias_value!r} disagree: "
                               "give one", alias)
    return value if value is not None else alias_value


def _count(value, param: str) -> int | None:
    if value is None:
        return None
    if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value < INT32_END):
        raise MediaOptionError(f"{param} must be an integer >= 1, got {value!r}", param)
    return value


def _rate(value, param: str) -> float | None:
    if value is None:
        return None
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0 < value <= FLOAT32_MAX):
        raise MediaOptionError(f"{param} must be a finite number > 0, got {value!r}", param)
    return float(value)


def _processor_kwargs(kwargs) -> tuple[tuple[str, object], ...]:
    if kwargs is None:
        return ()
    if not isinstance(kwargs, dict):
        raise MediaOptionError("mm_processor_kwargs must be an object of the model processor's keyword "
                               "arguments", "mm_processor_kwargs")
    for key, value in kwargs.items():
        if not isinstance(value, (int, float, str, bool)) or isinstance(value, float) and not math.isfinite(value):
            raise MediaOptionError(f"mm_processor_kwargs.{key} must be a number, string or boolean, got {value!r}",
                                   f"mm_processor_kwargs.{key}")
    return tuple(sorted(kwargs.items()))
