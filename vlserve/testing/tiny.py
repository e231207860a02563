"""Tiny random LLaVA checkpoints in exactly the Hugging Face format, for tests and examples.

`vlserve make-tiny-model DIR [--arch llava] [--text llama|mistral|qwen2] [--vision clip|siglip]`
writes config.json, safetensors weights, a byte-level BPE tokenizer trained here with the
`tokenizers` library (with `<image>` and a chat template), and the processor configs, in a second
or two. Nothing is downloaded. testing/tiny_architectures.py maps each --arch to the function that writes it.
"""

import json
import os
from dataclasses import dataclass

from vlserve.testing.checkpoint_tools import (
    BOS, EOS, IMAGE_TOKEN, LLAVA_CHAT_TEMPLATE, PAD, UNK, clip_image_processor_kwargs, llava_tokenizer,
    siglip_image_processor_kwargs,
)

SPECIAL_TOKENS = [UNK, BOS, EOS, PAD, IMAGE_TOKEN]

_CORPUS = """USER: What is in the image? ASSISTANT: A red circle on the left and a blue square.
The quick brown fox jumps over the lazy dog. How many shapes are there? There are three shapes.
What colour is the triangle? The triangle is green. Describe the picture in one sentence.
A vision-language model answers questions about images and videos. Is the circle moving left or right?
You are a helpful assistant. Hello! Hi! How can I help you today? {"name": "value", "count": 3}
Please answer with yes or no. Yes. No. The first frame shows a yellow square; the last one is purple.
"""


@dataclass
class TinyModelSpec:
    vocab_size: int = 384
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int | None = None
    tie_word_embeddings: bool = False
    rope_theta: float | None = None  # None: the text model's usual (1e6 for Qwen2, 1e4 otherwise)
    rope_scaling: dict | None = None
    text: str = "llama"  # a key of TEXT_MODELS
    vision: str = "clip"  # a key of VISION_MODELS
    sliding_window: int | None = None  # Mistral's window; Qwen2: its window on every layer (use_sliding_window)
    vision_hidden: int = 32
    vision_layers: int = 2
    vision_heads: int = 4
    vision_intermediate: int | None = None
    image_size: int = 32
    patch_size: int = 8
    vision_feature_layer: int | list[int] = -2
    vision_feature_select_strategy: str = "default"
    max_position_embeddings: int = 2048
    dtype: str = "float32"


def train_tokenizer(vocab_size: int, extra_text: str = ""):
    """A byte-level BPE with the LLaVA special tokens, trained on a small corpus in well under a second."""
    from vlserve.testing.bpe import train_byte_level_bpe

    return llava_tokenizer(train_byte_level_bpe([_CORPUS, extra_text], vocab_size, SPECIAL_TOKENS), 4096)


def _llama(spec: TinyModelSpec, common: dict):
    from transformers import LlamaConfig

    return LlamaConfig(**common)


def _mistral(spec: TinyModelSpec, common: dict):
    from transformers import MistralConfig

    return MistralConfig(**common, sliding_window=spec.sliding_window)


def _qwen2(spec: TinyModelSpec, common: dict):
    from transformers import Qwen2Config

    window = {"use_sliding_window": True, "sliding_window": spec.sliding_window, "max_window_layers": 0} \
        if spec.sliding_window else {"use_sliding_window": False}
    return Qwen2Config(**common, **window)


# --text → the transformers text config it writes; the usual rope_theta of each
TEXT_MODELS = {"llama": (_llama, 10000.0), "mistral": (_mistral, 10000.0), "qwen2": (_qwen2, 1000000.0)}


def _vision_config(spec: TinyModelSpec):
    from transformers import CLIPVisionConfig, SiglipVisionConfig

    common = dict(hidden_size=spec.vision_hidden, intermediate_size=spec.vision_intermediate or spec.vision_hidden * 2,
                  num_hidden_layers=spec.vision_layers, num_attention_heads=spec.vision_heads,
                  image_size=spec.image_size, patch_size=spec.patch_size)
    if spec.vision == "siglip":
        return SiglipVisionConfig(**common)
    return CLIPVisionConfig(**common, projection_dim=spec.vision_hidden)


VISION_MODELS = ("clip", "siglip")


def build_text_config(spec: TinyModelSpec, tokenizer):
    if spec.text not in TEXT_MODELS:
        raise ValueError(f"unknown text model {spec.text!r}; use one of {sorted(TEXT_MODELS)}")
    build, usual_theta = TEXT_MODELS[spec.text]
    common = dict(
        # rows past the tokenizer's vocabulary exist (as in real checkpoints) but are never produced by it
        vocab_size=max(len(tokenizer), spec.vocab_size), hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim or spec.hidden_size // spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings, tie_word_embeddings=spec.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta or usual_theta,
                         **(spec.rope_scaling or {})},
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return build(spec, common)


def tokens_per_image(spec: TinyModelSpec) -> int:
    """As transformers' LLaVA counts them: the patches, CLIP's CLS, less one position under "default"."""
    n = (spec.image_size // spec.patch_size) ** 2 + (spec.vision == "clip")
    return n - (spec.vision_feature_select_strategy == "default")


def build_hf_config(spec: TinyModelSpec, tokenizer):
    from transformers import LlavaConfig

    if spec.vision not in VISION_MODELS:
        raise ValueError(f"unknown vision model {spec.vision!r}; use one of {list(VISION_MODELS)}")
    return LlavaConfig(
        vision_config=_vision_config(spec), text_config=build_text_config(spec, tokenizer),
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=spec.vision_feature_layer,
        vision_feature_select_strategy=spec.vision_feature_select_strategy,
        image_seq_length=tokens_per_image(spec), tie_word_embeddings=spec.tie_word_embeddings)


def save_processor(out_dir: str, spec: TinyModelSpec, tokenizer) -> None:
    """preprocessor_config.json (CLIP: resize + centre crop; SigLIP: resize to the exact size) and
    processor_config.json (LlavaProcessor).

    LlavaProcessor expands <image> to (size/patch)^2 + num_additional_image_tokens - (1 if "default"),
    so a CLIP tower (which adds a CLS token) needs num_additional_image_tokens=1, SigLIP 0.
    """
    siglip = spec.vision == "siglip"
    image_processor = ({"image_processor_type": "SiglipImageProcessor",
                        **siglip_image_processor_kwargs(spec.image_size)}
                       if siglip else
                       {"image_processor_type": "CLIPImageProcessor", **clip_image_processor_kwargs(spec.image_size)})
    processor = {"processor_class": "LlavaProcessor", "patch_size": spec.patch_size,
                 "vision_feature_select_strategy": spec.vision_feature_select_strategy,
                 "num_additional_image_tokens": 0 if siglip else 1, "image_token": IMAGE_TOKEN}
    write_processor_files(out_dir, image_processor, processor)


def write_processor_files(out_dir: str, image_processor: dict, processor: dict) -> None:
    """preprocessor_config.json, processor_config.json and the chat template, as transformers writes them."""
    for name, data in (("preprocessor_config.json", image_processor), ("processor_config.json", processor)):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(data, f, indent=2)
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as f:
        f.write(LLAVA_CHAT_TEMPLATE)


def make_tiny_model(out_dir: str, seed: int = 0, spec: TinyModelSpec | None = None,
                    layout: str = "transformers", max_shard_size: str | None = None) -> str:
    """Writes a random LlavaForConditionalGeneration checkpoint (other architectures:
    testing/tiny_architectures.py)."""
    return make_tiny_llava(out_dir, seed, spec or TinyModelSpec(), layout, max_shard_size)


def make_tiny_llava(out_dir: str, seed: int, spec: TinyModelSpec, layout: str, max_shard_size: str | None) -> str:
    """LlavaForConditionalGeneration; layout "llava-hf" rewrites keys as the published checkpoints do."""
    import torch  # here, not at the top: the CLI imports this module for its choices and stays torch-free
    from transformers import LlavaForConditionalGeneration

    os.makedirs(out_dir, exist_ok=True)
    tokenizer = train_tokenizer(spec.vocab_size)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(build_hf_config(spec, tokenizer)).to(getattr(torch, spec.dtype))
    model.save_pretrained(out_dir, max_shard_size=max_shard_size or "10GB")
    tokenizer.save_pretrained(out_dir)
    save_processor(out_dir, spec, tokenizer)
    if layout == "llava-hf":
        rewrite_to_llava_hf_layout(out_dir)
    elif layout != "transformers":
        raise ValueError(f"unknown layout {layout!r}; use 'transformers' or 'llava-hf'")
    return out_dir


def rewrite_to_llava_hf_layout(ckpt_dir: str) -> None:
    """Renames weights to the published llava-hf layout (`vision_tower.vision_model.*`)."""
    rename_weights(ckpt_dir, _llava_hf_key)


def rename_weights(ckpt_dir: str, rename) -> None:
    """Renames every weight of a safetensors checkpoint (one file or shards with an index) by rename(name)."""
    from safetensors.torch import load_file, save_file

    index_path = os.path.join(ckpt_dir, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index_path))["weight_map"].values()))
             if os.path.exists(index_path) else ["model.safetensors"])
    renamed = {}
    for name in files:
        path = os.path.join(ckpt_dir, name)
        tensors = {rename(k): v for k, v in load_file(path).items()}
        save_file(tensors, path, metadata={"format": "pt"})
        renamed.update({k: name for k in tensors})
    if os.path.exists(index_path):
        index = json.load(open(index_path))
        index["weight_map"] = renamed
        json.dump(index, open(index_path, "w"), indent=2)


def _llava_hf_key(key: str) -> str:
    if key.startswith("vision_tower.") and not key.startswith("vision_tower.vision_model."):
        return "vision_tower.vision_model." + key[len("vision_tower."):]
    return key
