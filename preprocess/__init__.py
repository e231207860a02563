"""Media decoding, limits, processing and hashing (installed as vlserve.preprocess; never imports vlserve)."""

from .errors import MediaError
from .hashing import PSEUDO_TOKEN_END, PSEUDO_TOKEN_MIN, content_hash, is_pseudo_token, pad_values
from .frame_cache import FrameCache
from .image_cache import ProcessedImageCache
from .image_loader import IMAGE_FORMATS, decode_image, load_image, to_rgb
from .limits import MediaLimits, check_image_count
from .media_options import MediaOptionError, MediaOptions, VideoSampling
from .anyres import AnyresProcessing, PooledVideoProcessing
from .prepare import ProcessedImage, prepare_image, prepare_video, process_image
from .processing import (
    IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, ImageProcessing,
)
from .sources import MediaSource, read_source_bytes
from .video import DEFAULT_NUM_FRAMES, SampledVideo, VideoInfo, load_video, read_video, sample_indices

__all__ = [
    "AnyresProcessing", "DEFAULT_NUM_FRAMES", "FrameCache", "IMAGE_FORMATS", "IMAGENET_STANDARD_MEAN",
    "IMAGENET_STANDARD_STD",
    "OPENAI_CLIP_MEAN", "OPENAI_CLIP_STD", "PSEUDO_TOKEN_END", "PooledVideoProcessing",
    "PSEUDO_TOKEN_MIN", "ImageProcessing", "MediaError", "MediaLimits", "MediaOptionError",
    "MediaOptions", "MediaSource", "ProcessedImage",
    "ProcessedImageCache",
    "SampledVideo", "VideoInfo", "VideoSampling", "check_image_count", "content_hash", "decode_image",
    "is_pseudo_token",
    "load_image", "load_video", "pad_values", "prepare_image", "prepare_video", "process_image",
    "read_source_bytes", "read_video", "sample_indices", "to_rgb",
]
