"""The one table of what vlserve serves: config.json's architecture name → a Family.

A Family is the native model class, how its ModelConfig is read from transformers' config, which
text and vision model_types it accepts, and how its image processing is built from the checkpoint's
image-processor config. The loader looks the family up here once; nothing on the request path asks
which family it serves. Every refusal names what was found and lists what is supported.
"""

from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from vlserve.core.errors import CheckpointError
from vlserve.model.config import ModelConfig, model_config_from_hf
from vlserve.model.llava import (
    LlavaForServing, LlavaNextForServing, llava_next_config_from_hf, llava_next_video_config_from_hf,
    llava_onevision_config_from_hf,
)
from vlserve.model.qwen_vl import (
    Qwen25VLForServing, Qwen2VLForServing, Qwen3VLForServing, qwen_vl_config_from_hf,
)
from vlserve.preprocess import AnyresProcessing, ImageProcessing
from vlserve.preprocess.qwen_vl import QwenVLProcessing


@dataclass(frozen=True)
class Family:
    architecture: str  # config.json's "architectures" entry
    model_type: str  # config.json's "model_type" for it
    text_models: tuple[str, ...]  # text_config.model_type values served
    vision_models: tuple[str, ...]  # vision_config.model_type values served
    build_model: Callable[[ModelConfig], nn.Module]  # built on the meta device, then loaded
    config_from_hf: Callable[[Any], ModelConfig]
    image_processing: Callable[[dict], Any]  # ImageProcessing / AnyresProcessing from the image-processor config dict

    def describe(self) -> str:
        return f"{self.architecture} (text: {', '.join(self.text_models)}; vision: {', '.join(self.vision_models)})"


LLAVA = Family(
    architecture="LlavaForConditionalGeneration", model_type="llava",
    text_models=("llama", "mistral", "qwen2"), vision_models=("clip_vision_model", "siglip_vision_model"),
    build_model=LlavaForServing, config_from_hf=model_config_from_hf,
    image_processing=ImageProcessing.from_hf_config)

LLAVA_NEXT = Family(
    architecture="LlavaNextForConditionalGeneration", model_type="llava_next",
    text_models=("llama", "mistral", "qwen2"), vision_models=("clip_vision_model", "siglip_vision_model"),
    build_model=LlavaNextForServing, config_from_hf=llava_next_config_from_hf,
    image_processing=AnyresProcessing.from_hf_config)

LLAVA_ONEVISION = Family(
    architecture="LlavaOnevisionForConditionalGeneration", model_type="llava_onevision",
    text_models=("qwen2", "llama", "mistral"), vision_models=("siglip_vision_model", "clip_vision_model"),
    build_model=LlavaNextForServing, config_from_hf=llava_onevision_config_from_hf,
    image_processing=AnyresProcessing.onevision_from_hf_config)

LLAVA_NEXT_VIDEO = Family(
    architecture="LlavaNextVideoForConditionalGeneration", model_type="llava_next_video",
    text_models=("llama", "mistral", "qwen2"), vision_models=("clip_vision_model", "siglip_vision_model"),
    build_model=LlavaNextForServing, config_from_hf=llava_next_video_config_from_hf,
    image_processing=AnyresProcessing.next_video_from_hf_config)

QWEN2_VL = Family(
    architecture="Qwen2VLForConditionalGeneration", model_type="qwen2_vl",
    text_models=("qwen2_vl_text",), vision_models=("qwen2_vl_vision",),
    build_model=Qwen2VLForServing, config_from_hf=qwen_vl_config_from_hf,
    image_processing=QwenVLProcessing.from_hf_config)

QWEN2_5_VL = Family(
    architecture="Qwen2_5_VLForConditionalGeneration", model_type="qwen2_5_vl",
    text_models=("qwen2_5_vl_text",), vision_models=("qwen2_5_vl_vision",),
    build_model=Qwen25VLForServing, config_from_hf=qwen_vl_config_from_hf,
    image_processing=QwenVLProcessing.from_hf_config)

QWEN3_VL = Family(
    architecture="Qwen3VLForConditionalGeneration", model_type="qwen3_vl",
    text_models=("qwen3_vl_text",), vision_models=("qwen3_vl_vision",),
    build_model=Qwen3VLForServing, config_from_hf=qwen_vl_config_from_hf,
    image_processing=QwenVLProcessing.from_hf_config)

FAMILIES: dict[str, Family] = {f.architecture: f for f in (LLAVA, LLAVA_NEXT, LLAVA_ONEVISION, LLAVA_NEXT_VIDEO,
                                                            QWEN2_VL, QWEN2_5_VL, QWEN3_VL)}

# Architectures people try that vlserve does not serve, with what stands in the way.
REFUSED: dict[str, str] = {
    "Qwen3VLMoeForConditionalGeneration": "Qwen3-VL MoE: mixture-of-experts decoder layers (dense Qwen3-VL is served)",
    "Idefics2ForConditionalGeneration": "Idefics2: a perceiver resampler over split images",
    "Idefics3ForConditionalGeneration": "Idefics3: pixel-shuffled image splitting",
    "MllamaForConditionalGeneration": "Llama 3.2 Vision: cross-attention image layers",
    "PaliGemmaForConditionalGeneration": "PaliGemma: bidirectional attention over the image prefix",
}


def supported() -> str:
    return "; ".join(f.describe() for f in FAMILIES.values())


def family_for(hf_config) -> Family:
    """The family serving this transformers config; CheckpointError naming what is not served."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    family = next((FAMILIES[a] for a in archs if a in FAMILIES), None)
    if family is None and not archs:  # no "architectures": go by model_type, as AutoModel would
        family = next((f for f in FAMILIES.values() if f.model_type == hf_config.model_type), None)
    if family is None or family.model_type != hf_config.model_type:
        why = "; ".join(REFUSED[a] for a in archs if a in REFUSED)
        raise CheckpointError(
            f"unsupported architecture {archs or '(none given)'} (model_type {hf_config.model_type!r})"
            f"{': ' + why if why else ''}; vlserve serves {supported()}")
    text, vision = hf_config.text_config.model_type, hf_config.vision_config.model_type
    if text not in family.text_models:
        raise CheckpointError(f"unsupported text model {text!r} in {family.architecture}; "
                              f"supported: {', '.join(family.text_models)}")
    if vision not in family.vision_models:
        raise CheckpointError(f"unsupported vision model {vision!r} in {family.architecture}; "
                              f"supported: {', '.join(family.vision_models)}")
    return family
