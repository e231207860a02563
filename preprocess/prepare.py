"""Source to model-ready pixels plus content hash. Pure and thread-safe: meant for a worker thread.

A processing is any object with `process(PIL image) -> ProcessedImage`, `for_image_count(n)` (the
processing for each of n images in one prompt) and `process_frames(frames)` (ImageProcessing for
one view, AnyresProcessing for tiles, PooledVideoProcessing for frames; or `process_sampled(video)`,
which also takes where the frames came from: QwenVLMediaProcessing); it must be hashable, since
it keys the processed-image cache. A model's processing also lists the mm_processor_kwargs a request
may give (`mm_processor_keys`) and makes the processing with them (`with_mm_kwargs(**kwargs)`).
"""

from PIL import Image

from .frame_cache import FrameCache
from .image_loader import load_image
from .limits import MediaLimits
from .processed import ProcessedImage
from .sources import MediaSource
from .video import plan_video
from .video_reuse import prepare_planned_video

__all__ = ["ProcessedImage", "prepare_image", "prepare_video", "process_image"]


def process_image(image: Image.Image, processing) -> ProcessedImage:
    return processing.process(image)


def prepare_image(source: MediaSource, processing, limits: MediaLimits = MediaLimits()) -> ProcessedImage:
    return process_image(load_image(source, limits), processing)


def prepare_video(source: MediaSource, processing, limits: MediaLimits = MediaLimits(),
                  num_frames: int | None = None, fps: float | None = None,
                  max_frames: int | None = None, frame_cache: FrameCache | None = None) -> list[ProcessedImage]:
    """With a frame cache, only frames no earlier clip decoded from the same packets are decoded
    (preprocess/video_reuse.py); the result is the same."""
    return prepare_planned_video(plan_video(source, limits, num_frames, fps, max_frames), processing, frame_cache)
