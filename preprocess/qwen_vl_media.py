"""A Qwen-VL checkpoint's media processing: its picture processing (preprocessor_config.json) and
its video processing (video_preprocessor_config.json where the checkpoint has one, else the picture
processor's file, as transformers' AutoVideoProcessor falls back to it).

It is the one processing object the request builder holds for the family, so both kinds of media
go through the processed-media cache (preprocess/image_cache.py) keyed by it, and a request's
mm_processor_kwargs (min_pixels / max_pixels) apply to pictures and videos alike, as transformers'
processor passes them to both.
"""

from dataclasses import dataclass
from typing import Any

from PIL import Image

from .qwen_vl import QwenVLImage, QwenVLProcessing
from .qwen_vl_video import QwenVLVideoProcessing
from .video import SampledVideo


@dataclass(frozen=True)
class QwenVLMediaProcessing:
    image: QwenVLProcessing
    video: QwenVLVideoProcessing

    @classmethod
    def from_hf_configs(cls, model_type: str, image_config: dict[str, Any],
                        video_config: dict[str, Any] | None) -> "QwenVLMediaProcessing":
        """model_type: transformers' (qwen2_vl, qwen2_5_vl, qwen3_vl); video_config: the checkpoint's
        video_preprocessor_config.json, None where it has none (its videos then read image_config)."""
        return cls(QwenVLProcessing.from_hf_config(image_config),
                   QwenVLVideoProcessing.from_hf_config(model_type, image_config if video_config is None
                                                        else video_config))

    def process(self, image: Image.Image) -> QwenVLImage:
        return self.image.process(image)

    def process_sampled(self, video: SampledVideo) -> list[QwenVLImage]:
        """A decoded video's temporal patches (preprocess/prepare.py's prepare_video calls this)."""
        return self.video.process_sampled(video)

    def for_image_count(self, n: int) -> "QwenVLMediaProcessing":
        return self

    @property
    def mm_processor_keys(self) -> frozenset[str]:
        return self.image.mm_processor_keys

    def with_mm_kwargs(self, **kwargs) -> "QwenVLMediaProcessing":
        return QwenVLMediaProcessing(self.image.with_mm_kwargs(**kwargs), self.video.with_mm_kwargs(**kwargs))
