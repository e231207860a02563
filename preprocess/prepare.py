"""Source to model-ready pixels plus content hash. Pure and thread-safe: meant for a worker thread."""

from dataclasses import dataclass

import numpy as np
from PIL import Image

from .hashing import content_hash
from .image_loader import load_image
from .limits import MediaLimits
from .processing import ImageProcessing
from .sources import MediaSource
from .video import load_video


@dataclass(frozen=True)
class ProcessedImage:
    pixel_values: np.ndarray  # float32 [3, H, W], C-contiguous
    content_hash: bytes  # 16 bytes, xxh3_128 of pixel_values


def process_image(image: Image.Image, processing: ImageProcessing) -> ProcessedImage:
    pixels = processing(image)
    return ProcessedImage(pixels, content_hash(pixels))


def prepare_image(source: MediaSource, processing: ImageProcessing,
                  limits: MediaLimits = MediaLimits()) -> ProcessedImage:
    return process_image(load_image(source, limits), processing)


def prepare_video(source: MediaSource, processing: ImageProcessing, limits: MediaLimits = MediaLimits(),
                  num_frames: int | None = None, fps: float | None = None) -> list[ProcessedImage]:
    return [process_image(frame, processing) for frame in load_video(source, limits, num_frames, fps)]
