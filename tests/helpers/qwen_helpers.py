"""Tiny Qwen-VL checkpoints built with transformers' own classes, and the two sides of a parity test:
transformers' greedy generation with per-step logits, and the engine's requests built as the
request builder builds them (pseudo tokens at the media positions, M-RoPE positions from the spans)."""

import json
import os

import numpy as np
import torch

from vlserve.core.request import Req
from vlserve.core.sampling_params import SamplingParams
from vlserve.engine.qwen_prompt import VideoPad, expand_qwen_media
from vlserve.preprocess import ProcessedImage, content_hash
from vlserve.testing.bpe import train_byte_level_bpe

MERGE, TEMPORAL = 2, 2
TEXT_VOCAB = 300  # the trained BPE's; the special tokens follow, the decoder's rows are padded past them
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
           "<|image_pad|>", "<|video_pad|>"]
CORPUS = "What is in the picture? A red circle and a blue square. Describe this video, frame by frame.\n" * 4


def write_tokenizer(path: str):
    from transformers import PreTrainedTokenizerFast

    tok = train_byte_level_bpe([CORPUS], TEXT_VOCAB, SPECIAL)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.save_pretrained(path)
    return {name: fast.convert_tokens_to_ids(t) for name, t in
            (("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
             ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
             ("eos_token_id", "<|im_end|>"))}


# --arch name → (transformers class name, patch size, vision config beyond the common part)
ARCHS = {
    "qwen2-vl": ("Qwen2VLForConditionalGeneration", 14, dict(embed_dim=32, hidden_size=64, mlp_ratio=2)),
    # 56-pixel windows: 2x2 merged units, so the odd picture spans six windows; the last block attends fully
    "qwen2.5-vl": ("Qwen2_5_VLForConditionalGeneration", 14,
                   dict(hidden_size=32, intermediate_size=64, out_hidden_size=64, window_size=56,
                        fullatt_block_indexes=[1], tokens_per_second=2)),
    # a 6x6 learned position grid resampled to each picture; DeepStack from both tower layers
    "qwen3-vl": ("Qwen3VLForConditionalGeneration", 16,
                 dict(hidden_size=32, intermediate_size=64, out_hidden_size=64, num_position_embeddings=36,
                      deepstack_visual_indexes=[0, 1])),
}


def make_qwen_vl(path: str, arch: str, seed: int = 0, tie: bool = False) -> str:
    """A random Qwen-VL checkpoint of this --arch (fp32, a few hundred KB) with its tokenizer and
    image-processor config, as transformers saves it."""
    import transformers

    class_name, patch, vision_extra = ARCHS[arch]
    os.makedirs(path, exist_ok=True)
    ids = write_tokenizer(path)
    text = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=4096, eos_token_id=ids["eos_token_id"],
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]})
    vision = dict(depth=2, num_heads=2, patch_size=patch, spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL,
                  **vision_extra)
    if arch == "qwen3-vl":
        text["head_dim"] = 16  # Qwen3's config does not derive it from the width
    config_class = getattr(transformers, class_name.replace("ForConditionalGeneration", "Config"))
    config = config_class(text_config=text, vision_config=vision, tie_word_embeddings=tie,
                          **{k: v for k, v in ids.items() if k != "eos_token_id"})
    torch.manual_seed(seed)
    model = getattr(transformers, class_name)(config).eval()
    with torch.no_grad():  # random init leaves the norms at one and biases at zero: perturb them too
        for name, p in model.named_parameters():
            if "norm" in name or "ln_q" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump({"image_processor_type": "Qwen2VLImageProcessor", "patch_size": patch, "merge_size": MERGE,
                   "temporal_patch_size": TEMPORAL, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 64}, f)
    return path


def random_picture(grid_hw: tuple[int, int], gen: torch.Generator, patch: int = 14) -> np.ndarray:
    """A picture's pixels as the model takes them: [1, h, w, patch] (transformers' pixel_values rows)."""
    h, w = grid_hw
    return torch.randn(1, h, w, 3 * TEMPORAL * patch * patch, generator=gen).numpy()


def video_pad(patches: list[np.ndarray], seconds: float | None = None) -> VideoPad:
    """A video pad of these temporal patches ([1, h, w, patch] each), keyed per patch."""
    return VideoPad([ProcessedImage(p, content_hash(p, role="video"), role="video") for p in patches], seconds)


def build_req(ids: list[int], media: list, cfg, max_new_tokens: int, rid: str = "r") -> Req:
    """As RequestBuilder builds it: each pad expanded to its media's pseudo tokens (pictures as
    arrays, videos as VideoPads, in prompt order), then the M-RoPE positions from the spans."""
    images = [ProcessedImage(m, content_hash(m)) for m in media if not isinstance(m, VideoPad)]
    videos = [m for m in media if isinstance(m, VideoPad)]
    expanded, spans = expand_qwen_media(ids, cfg.image_token_id, cfg.video_token_id, images, videos, cfg.image_tokens)
    req = Req(rid, expanded, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True), spans,
              return_logprob=True, logprob_start_len=-1, top_logprobs_num=20)
    req.mrope = cfg.mrope.positions(len(expanded), spans)
    return req


def hf_inputs(ids: list[int], media: list, cfg) -> dict:
    """transformers' inputs for the same prompt: pads repeated, pixel_values(_videos), grids, token types,
    second_per_grid_ts (one grid per video pad: a Qwen3-VL frame pair's is its own, which is how
    transformers splits a Qwen3-VL video's grid)."""
    expanded, types, it = [], [], iter(media)
    pictures, videos = [], []
    for t in ids:
        if t not in (cfg.image_token_id, cfg.video_token_id):
            expanded.append(t)
            types.append(0)
            continue
        item = next(it)
        if isinstance(item, VideoPad):
            videos.append(item)
            n, kind = sum(cfg.image_tokens(p) for p in item.patches), 2
        else:
            pictures.append(item)
            n, kind = cfg.image_tokens(ProcessedImage(item, b"")), 1
        expanded += [t] * n
        types += [kind] * n
    inputs = {"input_ids": torch.tensor([expanded]), "mm_token_type_ids": torch.tensor([types])}
    rows = lambda arrays: torch.cat([torch.from_numpy(a).reshape(-1, a.shape[-1]) for a in arrays])  # noqa: E731
    if pictures:
        inputs["pixel_values"] = rows(pictures)
        inputs["image_grid_thw"] = torch.tensor([p.shape[:3] for p in pictures])
    if videos:
        inputs["pixel_values_videos"] = rows([p.pixel_values for v in videos for p in v.patches])
        inputs["video_grid_thw"] = torch.tensor([(len(v.patches), *v.patches[0].pixel_values.shape[1:3])
                                                 for v in videos])
        if cfg.mrope.tokens_per_second is not None:
            inputs["second_per_grid_ts"] = torch.tensor([v.second_per_grid_t or 1.0 for v in videos])
    return inputs


def hf_greedy(hf, inputs: dict, steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy ids and the log-softmax after the prompt and after each generated token."""
    out = hf.generate(**inputs, max_new_tokens=steps, do_sample=False, output_logits=True,
                      return_dict_in_generate=True)
    n = inputs["input_ids"].shape[1]
    return out.sequences[0, n:].tolist(), [torch.log_softmax(x[0].float(), -1) for x in out.logits]
