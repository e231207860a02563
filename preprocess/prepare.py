"""Source to model-ready pixels plus content hash. Pure and thread-safe: meant for a worker thread.

A processing is any object with `process(PIL image) -> ProcessedImage`, `for_image_count(n)` (the
processing for each of n images in one prompt) and `process_frames(frames)` (ImageProcessing for
one view, AnyresProcessing for tiles, PooledVideoProcessing for frames; or `process_sampled(video)`,
which also takes where the frames came from: QwenVLMediaProcessing); it must be hashable, since
it keys the processed-image cache. A model's processing also lists the mm_processor_kwargs a request
may give (`mm_processor_keys`) and makes the processing with them (`with_mm_kwargs(**kwargs)`).
"""

from PIL import Image

from .image_loader import load_image
from .limits import MediaLimits
from .processed import ProcessedImage
from .sources import MediaSource
from .video import load_video, read_video

__all__ = ["ProcessedImage", "prepare_image", "prepare_video", "process_image"]


def process_image(image: Image.Image, processing) -> ProcessedImage:
    return processing.process(image)


def prepare_image(source: MediaSource, processing, limits: MediaLimits = MediaLimits()) -> ProcessedImage:
    return process_image(load_image(source, limits), processing)


def prepare_video(source: MediaSource, processing, limits: MediaLimits = MediaLimits(),
                  num_frames: int | None = None, fps: float | None = None,
                  max_frames: int | None = None) -> list[ProcessedImage]:
    if hasattr(processing, "process_sampled"):  # it needs where the frames came from (Qwen-VL: fps, timestamps)
        return processing.process_sampled(read_video(source, limits, num_frames, fps, max_frames))
    return processing.process_frames(load_video(source, limits, num_frames, fps, max_frames))
