"""Tiny random Qwen2-VL, Qwen2.5-VL and Qwen3-VL checkpoints, as transformers saves them.

Each writer builds the transformers config, initialises the model at random from a seed, and
`save_pretrained`s it beside a byte-level BPE tokenizer that carries Qwen's special tokens after its
vocabulary (as Qwen's do, past 151k), the model's chat template, preprocessor_config.json (and
video_preprocessor_config.json for Qwen3-VL, which publishes one) and generation_config.json with
Qwen's two EOS ids. The decoder's vocabulary is padded past the tokenizer, as in the published
checkpoints. layout="published" rewrites config.json and the weight names as the Hub's checkpoints
have them: Qwen2-VL and Qwen2.5-VL flat (text keys at the top, `rope_scaling: {"type": "mrope"}`,
`model.layers.*` and `visual.*`), Qwen3-VL nested with `rope_scaling`. torch and transformers are
imported only when a checkpoint is written.
"""

import json
import os
from dataclasses import dataclass

from vlserve.preprocess import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
# In Qwen's order (151643..151656 in the real vocabulary, less the object/box/quad tokens)
QWEN_SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]

_CORPUS = """<|im_start|>system You are a helpful assistant. What is in the image? A red circle and a blue square.
Describe this video. The square moves from left to right over four seconds. How many frames are there?
The quick brown fox jumps over the lazy dog. What colour is the triangle? The triangle is green. Yes. No.
"""

# Qwen2-VL's and Qwen2.5-VL's published template: a default system turn, each picture or video as
# its vision start/pad/end tokens where its part stands ("Picture N: " with add_vision_id).
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3-VL's published template without its tool-calling and reasoning branches: no default system
# turn; pictures and videos as in Qwen2-VL (the processor expands a video into timestamped frame pairs).
QWEN3_VL_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif content['type'] == 'video' or 'video' in content %}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in content %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TinyQwenVLSpec:
    """The sizes of a tiny Qwen-VL checkpoint (a few MB)."""
    bpe_vocab_size: int = 360  # the trained BPE's size; the special tokens come after it
    vocab_size: int = 512  # the decoder's rows, padded past the tokenizer as Qwen's are
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    mrope_section: tuple[int, int, int] = (2, 3, 3)  # (t, h, w) frequency pairs; sums to head_dim / 2
    vision_hidden: int = 32
    vision_layers: int = 2
    vision_heads: int = 2
    vision_intermediate: int | None = None  # None: twice vision_hidden
    window_size: int = 56  # Qwen2.5-VL: the windowed layers' window in pixels (published: 112)
    fullatt_block_indexes: tuple[int, ...] | None = None  # Qwen2.5-VL: None: the last layer only
    # the image processor's bounds: 4 to 64 merged tokens a picture
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 64
    dtype: str = "float32"


@dataclass(frozen=True)
class QwenArch:
    name: str  # --arch
    architecture: str  # the transformers class
    patch_size: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    chat_template: str
    processor_class: str
    rope_theta: float


QWEN2_VL = QwenArch("qwen2-vl", "Qwen2VLForConditionalGeneration", 14, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD,
                    QWEN2_VL_CHAT_TEMPLATE, "Qwen2VLProcessor", 1e6)
QWEN2_5_VL = QwenArch("qwen2.5-vl", "Qwen2_5_VLForConditionalGeneration", 14, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD,
                      QWEN2_VL_CHAT_TEMPLATE, "Qwen2_5_VLProcessor", 1e6)
QWEN3_VL = QwenArch("qwen3-vl", "Qwen3VLForConditionalGeneration", 16, IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD,
                    QWEN3_VL_CHAT_TEMPLATE, "Qwen3VLProcessor", 5e6)
QWEN_ARCHS = {a.name: a for a in (QWEN2_VL, QWEN2_5_VL, QWEN3_VL)}
LAYOUTS = ("transformers", "published")


def train_qwen_tokenizer(spec: TinyQwenVLSpec):
    """A byte-level BPE with Qwen's special tokens appended after its vocabulary; EOS <|im_end|>,
    pad <|endoftext|>, no BOS (as Qwen's instruct tokenizers)."""
    from transformers import PreTrainedTokenizerFast

    from vlserve.testing.bpe import train_byte_level_bpe

    tok = train_byte_level_bpe([_CORPUS], spec.bpe_vocab_size, [])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT,
                                   model_max_length=32768)
    others = [t for t in QWEN_SPECIAL_TOKENS if t not in (IM_END, ENDOFTEXT)]
    fast.add_special_tokens({"additional_special_tokens": others})
    if len(fast) > spec.vocab_size:
        raise ValueError(f"vocab_size {spec.vocab_size} is below the tokenizer's {len(fast)} tokens")
    return fast


def token_ids(tokenizer) -> dict[str, int]:
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    return {"image_token_id": ids[IMAGE_PAD], "video_token_id": ids[VIDEO_PAD],
            "vision_start_token_id": ids[VISION_START], "vision_end_token_id": ids[VISION_END],
            "bos_token_id": ids[ENDOFTEXT], "eos_token_id": ids[IM_END], "pad_token_id": ids[ENDOFTEXT]}


def _text_config(arch: QwenArch, spec: TinyQwenVLSpec, ids: dict[str, int]) -> dict:
    rope = {"rope_type": "default", "rope_theta": arch.rope_theta, "mrope_section": list(spec.mrope_section)}
    if arch is QWEN3_VL:
        rope["mrope_interleaved"] = True
    return dict(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, max_position_embeddings=4096,
                rope_parameters=rope, bos_token_id=ids["bos_token_id"], eos_token_id=ids["eos_token_id"],
                pad_token_id=ids["pad_token_id"], **({} if arch is QWEN3_VL else {"use_sliding_window": False}))


def _vision_config(arch: QwenArch, spec: TinyQwenVLSpec) -> dict:
    common = dict(depth=spec.vision_layers, num_heads=spec.vision_heads, patch_size=arch.patch_size,
                  spatial_merge_size=2, temporal_patch_size=2)
    if arch is QWEN2_VL:  # hidden_size is the merger's output: the decoder's width
        return dict(common, embed_dim=spec.vision_hidden, hidden_size=spec.hidden_size, mlp_ratio=2)
    common.update(hidden_size=spec.vision_hidden, intermediate_size=spec.vision_intermediate or spec.vision_hidden * 2,
                  out_hidden_size=spec.hidden_size)
    if arch is QWEN2_5_VL:
        # by default 56-pixel windows (2x2 merged patches) so that small pictures span several windows,
        # and the last layer attending fully, as every 8th does in the published towers
        full = list(spec.fullatt_block_indexes or [spec.vision_layers - 1])
        return dict(common, window_size=spec.window_size, fullatt_block_indexes=full, tokens_per_second=2)
    # Qwen3-VL: a 6x6 learned position grid (interpolated to each picture), DeepStack from every layer
    return dict(common, num_position_embeddings=36, deepstack_visual_indexes=list(range(spec.vision_layers)))


def build_qwen_vl_config(arch: QwenArch, spec: TinyQwenVLSpec, tokenizer):
    import transformers

    ids = token_ids(tokenizer)
    config_class = getattr(transformers, arch.architecture.replace("ForConditionalGeneration", "Config"))
    if arch is QWEN3_VL and spec.num_layers < spec.vision_layers:
        raise ValueError("Qwen3-VL's DeepStack adds one tower layer's features into each of the first decoder layers: "
                         f"num_layers ({spec.num_layers}) must be >= vision_layers ({spec.vision_layers})")
    return config_class(text_config=_text_config(arch, spec, ids), vision_config=_vision_config(arch, spec),
                        image_token_id=ids["image_token_id"], video_token_id=ids["video_token_id"],
                        vision_start_token_id=ids["vision_start_token_id"],
                        vision_end_token_id=ids["vision_end_token_id"], tie_word_embeddings=False)


def processor_configs(arch: QwenArch, spec: TinyQwenVLSpec) -> dict[str, dict]:
    """File name → contents: the image processor's (min/max_pixels, as Qwen2-VL and Qwen2.5-VL publish
    them, which their video processor inherits) and, for Qwen3-VL, its video processor's (`size`)."""
    common = {"patch_size": arch.patch_size, "temporal_patch_size": 2, "merge_size": 2,
              "image_mean": list(arch.image_mean), "image_std": list(arch.image_std), "do_convert_rgb": True,
              "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "resample": 3,
              "processor_class": arch.processor_class}
    if arch is not QWEN3_VL:
        return {"preprocessor_config.json": {"image_processor_type": "Qwen2VLImageProcessor", **common,
                                             "min_pixels": spec.min_pixels, "max_pixels": spec.max_pixels}}
    return {"preprocessor_config.json": {"image_processor_type": "Qwen2VLImageProcessorFast", **common,
                                         "size": {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}},
            # a video's pixel budget is over all its frames together: 16 frames at the picture's maximum
            "video_preprocessor_config.json": {"video_processor_type": "Qwen3VLVideoProcessor", **common,
                                               "size": {"shortest_edge": spec.min_pixels,
                                                        "longest_edge": spec.max_pixels * 16},
                                               "fps": 2, "do_sample_frames": True}}


def write_processor_files(out_dir: str, arch: QwenArch, spec: TinyQwenVLSpec, tokenizer) -> None:
    for name, data in processor_configs(arch, spec).items():
        _write_json(os.path.join(out_dir, name), data)
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as f:
        f.write(arch.chat_template)
    ids = token_ids(tokenizer)
    _write_json(os.path.join(out_dir, "generation_config.json"),
                {"bos_token_id": ids["bos_token_id"], "pad_token_id": ids["pad_token_id"],
                 "eos_token_id": [ids["eos_token_id"], ids["bos_token_id"]]})


def make_tiny_qwen_vl(out_dir: str, arch: str = "qwen2-vl", seed: int = 0, spec: TinyQwenVLSpec | None = None,
                      layout: str = "transformers") -> str:
    import torch
    import transformers

    if arch not in QWEN_ARCHS:
        raise ValueError(f"unknown Qwen-VL architecture {arch!r}; use one of {sorted(QWEN_ARCHS)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not written for --arch {arch}; use one of {list(LAYOUTS)}")
    qwen, spec = QWEN_ARCHS[arch], spec or TinyQwenVLSpec()
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = train_qwen_tokenizer(spec)
    torch.manual_seed(seed)
    model = getattr(transformers, qwen.architecture)(build_qwen_vl_config(qwen, spec, tokenizer))
    perturb_norms_and_biases(model)
    model.to(getattr(torch, spec.dtype)).save_pretrained(out_dir)
    tokenizer.chat_template = qwen.chat_template
    tokenizer.save_pretrained(out_dir)
    write_processor_files(out_dir, qwen, spec, tokenizer)
    if layout == "published":
        from vlserve.testing.tiny_qwen_layout import rewrite_to_published_layout

        rewrite_to_published_layout(out_dir, flat=qwen is not QWEN3_VL)
    return out_dir


def perturb_norms_and_biases(model, scale: float = 0.1) -> None:
    """Random init leaves norm weights at one and biases at zero, where a parity test could not tell
    a norm or bias left out: move them off those values (from torch's seeded generator)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_q" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * scale)


def _write_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
