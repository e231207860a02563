"""A Qwen-VL request's token ids and media spans from its prompt (text or ids), pictures and videos.

The prompt carries the chat template's `<|vision_start|><|image_pad|><|vision_end|>` (and
`...<|video_pad|>...`) where each picture and video stands; a pad is expanded to its media's pseudo
tokens by qwen_prompt.expand_qwen_media, so prompt_tokens equals transformers' expanded length.
Pictures go through the model's QwenVLProcessing (smart_resize, patches), cached by their raw bytes
like every picture; a video is read (the engine's frame sampling), paired into temporal patches by
its QwenVLVideoProcessing, and cached by its bytes and sampling. Qwen3-VL writes each frame pair
after its `<t seconds>` text between its own vision start/end, so its video wrapper is replaced by
that text and each of its pads stands for one pair.
"""

import json
import os
from dataclasses import dataclass

import xxhash

from vlserve.core.errors import InvalidRequest
from vlserve.engine.prompt import tokenize_text
from vlserve.engine.qwen_prompt import VIDEO_WRAPPER, VideoPad, expand_qwen_media, qwen3_video_text
from vlserve.preprocess import MediaLimits, ProcessedImageCache, read_source_bytes, read_video
from vlserve.preprocess.qwen_vl_video import QWEN3_VL, QwenVLVideo, QwenVLVideoProcessing, process_sampled_video

VIDEO_PROCESSOR_FILE = "video_preprocessor_config.json"


def video_processing_for(model_dir: str, model_type: str, image_config: dict) -> QwenVLVideoProcessing:
    """The checkpoint's video processing: video_preprocessor_config.json where it has one, else the
    image processor's config (Qwen2-VL and Qwen2.5-VL videos inherit it)."""
    path = os.path.join(model_dir, VIDEO_PROCESSOR_FILE)
    config = image_config
    if os.path.isfile(path):
        with open(path) as f:
            config = json.load(f)
    return QwenVLVideoProcessing.from_hf_config(model_type, config)


@dataclass
class QwenMedia:
    """What RequestBuilder needs for a Qwen-VL model's prompts."""
    image_token_id: int
    video_token_id: int
    video_processing: QwenVLVideoProcessing
    interleaved_video: bool  # Qwen3-VL: timestamped frame pairs, one pad each

    @classmethod
    def for_model(cls, model_dir: str, config, model_type: str, image_config: dict) -> "QwenMedia":
        return cls(config.image_token_id, config.video_token_id,
                   video_processing_for(model_dir, model_type, image_config), model_type == QWEN3_VL)

    def expanded(self, tokenizer, config, processing, cache: ProcessedImageCache, limits: MediaLimits,
                 prompt: str | None, input_ids: list[int] | None, image_data: list, video_data: list,
                 num_frames: int | None, fps: float | None) -> tuple[list[int], list]:
        """(expanded ids, spans) of one request."""
        images = [cache.prepare_image(src, processing, limits) for src in image_data]
        videos = [self._video(cache, limits, src, num_frames, fps) for src in video_data]
        if prompt is not None:
            if not isinstance(prompt, str):
                raise InvalidRequest("prompt must be a string")
            ids = tokenize_text(tokenizer, self._video_text(prompt, videos))
        else:
            vocab = config.text.vocab_size
            if not (isinstance(input_ids, list) and all(isinstance(t, int) and 0 <= t < vocab for t in input_ids)):
                raise InvalidRequest(f"input_ids must be a list of token ids in [0, {vocab})")
            ids = list(input_ids)
        pads = [VideoPad([p], v.second_per_grid_t) for v in videos for p in v.patches] if self.interleaved_video \
            else [VideoPad(list(v.patches), v.second_per_grid_t) for v in videos]
        return expand_qwen_media(ids, self.image_token_id, self.video_token_id, images, pads, config.image_tokens)

    def _video_text(self, prompt: str, videos: list[QwenVLVideo]) -> str:
        """Qwen3-VL: each video's wrapper replaced by its timestamped frame pairs, in order."""
        if not self.interleaved_video or not videos:
            return prompt
        parts = prompt.split(VIDEO_WRAPPER)
        if len(parts) - 1 != len(videos):
            raise InvalidRequest(f"the prompt has {len(parts) - 1} video wrappers ({VIDEO_WRAPPER}) for "
                                 f"{len(videos)} videos")
        return parts[0] + "".join(qwen3_video_text(v.timestamps) + rest for v, rest in zip(videos, parts[1:]))

    def _video(self, cache: ProcessedImageCache, limits: MediaLimits, source, num_frames: int | None,
               fps: float | None) -> QwenVLVideo:
        data = read_source_bytes(source, limits, "video_max_bytes", "video")
        key = ("qwen-video", xxhash.xxh3_128_digest(data), len(data), self.video_processing, limits, num_frames, fps)
        found = cache.get(key)
        if found is not None:
            return found[0]
        video = process_sampled_video(self.video_processing, read_video(data, limits, num_frames, fps))
        cache.put(key, (video,))
        return video
