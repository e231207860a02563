"""Loads a Hugging Face LLaVA checkpoint directory into the native serving model.

Accepts both weight-key layouts in use: the published llava-hf one
(`language_model.model.*`, `vision_tower.vision_model.*`, `multi_modal_projector.*`,
`language_model.lm_head.*`) and the ones transformers writes (`vision_tower.embeddings.*`
without the `vision_model` level; `model.language_model.*` / `lm_head.*`).
"""

import json
import os
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import safe_open

from vlserve.core.errors import CheckpointError
from vlserve.model.config import ModelConfig, model_config_from_hf, parse_dtype
from vlserve.model.llava import LlavaForServing

WEIGHT_FILE = "model.safetensors"
WEIGHT_INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
PROCESSOR_FILE = "preprocessor_config.json"
PROCESSOR_FALLBACK = "processor_config.json"  # current transformers keeps the image processor in here

# (prefix in the checkpoint, prefix in LlavaForServing); first match wins, so longer prefixes first.
_KEY_PREFIXES = (
    ("model.language_model.", "language_model."),
    ("model.vision_tower.vision_model.", "vision.vision_tower."),
    ("model.vision_tower.", "vision.vision_tower."),
    ("model.multi_modal_projector.", "vision.multi_modal_projector."),
    ("language_model.model.", "language_model."),
    ("language_model.lm_head.", "lm_head."),
    ("vision_tower.vision_model.", "vision.vision_tower."),
    ("vision_tower.", "vision.vision_tower."),
    ("multi_modal_projector.", "vision.multi_modal_projector."),
    ("lm_head.", "lm_head."),
)


@dataclass
class LoadedModel:
    path: str
    config: ModelConfig
    model: LlavaForServing
    tokenizer: Any  # transformers PreTrainedTokenizerFast
    processor_config: dict  # preprocessor_config.json
    hf_config: Any


def native_key(key: str) -> str | None:
    for src, dst in _KEY_PREFIXES:
        if key.startswith(src):
            return dst + key[len(src):]
    return None


def check_checkpoint_dir(path: str) -> list[str]:
    """Returns the weight files; raises CheckpointError naming whatever is missing."""
    if not os.path.isdir(path):
        raise CheckpointError(f"model path {path!r} is not a directory")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise CheckpointError(f"{path}: missing config.json")
    if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        raise CheckpointError(f"{path}: missing tokenizer (one of {', '.join(TOKENIZER_FILES)})")
    if not os.path.isfile(os.path.join(path, PROCESSOR_FILE)) and "image_processor" not in _json(path, PROCESSOR_FALLBACK):
        raise CheckpointError(f"{path}: missing {PROCESSOR_FILE} (the image processor config; an "
                              f"\"image_processor\" entry in {PROCESSOR_FALLBACK} does as well)")
    index = os.path.join(path, WEIGHT_INDEX)
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        missing = [s for s in shards if not os.path.isfile(os.path.join(path, s))]
        if missing:
            raise CheckpointError(f"{path}: missing weight shards named in {WEIGHT_INDEX}: {missing}")
        return [os.path.join(path, s) for s in shards]
    if os.path.isfile(os.path.join(path, WEIGHT_FILE)):
        return [os.path.join(path, WEIGHT_FILE)]
    raise CheckpointError(f"{path}: missing weights ({WEIGHT_FILE} or {WEIGHT_INDEX}; only safetensors are read)")


def read_state_dict(files: list[str], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    state = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for key in f.keys():
                name = native_key(key)
                if name is None:
                    raise CheckpointError(f"{file}: unexpected weight {key!r} (not a LLaVA weight name)")
                state[name] = f.get_tensor(key).to(dtype)
    return state


def load_model(path: str, dtype: str | torch.dtype | None = None, device: str = "cpu") -> LoadedModel:
    from transformers import AutoConfig, AutoTokenizer

    files = check_checkpoint_dir(path)
    try:
        hf_config = AutoConfig.from_pretrained(path)
    except (ValueError, KeyError, OSError) as e:
        raise CheckpointError(f"{path}: config.json could not be read: {e}") from e
    cfg = model_config_from_hf(hf_config)
    if dtype is not None:
        cfg = _with_dtype(cfg, parse_dtype(dtype))
    with torch.device("meta"):
        model = LlavaForServing(cfg)
    state = read_state_dict(files, cfg.dtype)
    expected = set(model.state_dict().keys())
    if cfg.text.tie_word_embeddings:
        expected.discard("lm_head.weight")
        state.pop("lm_head.weight", None)
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not match the config: missing {missing[:8]}, unexpected {unexpected[:8]}")
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.text.tie_word_embeddings:  # assign=True replaced embed_tokens.weight; re-tie the head to it
        model.lm_head.weight = model.language_model.embed_tokens.weight
    _materialise_buffers(model, cfg)
    model.language_model.fuse_projections()
    model = model.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not getattr(tokenizer, "chat_template", None):  # the processor's chat_template.json, as AutoProcessor reads it
        tokenizer.chat_template = _json(path, "chat_template.json").get("chat_template")
    processor_config = _json(path, PROCESSOR_FILE) or _json(path, PROCESSOR_FALLBACK)["image_processor"]
    return LoadedModel(path, cfg, model, tokenizer, processor_config, hf_config)


def _json(path: str, name: str) -> dict:
    """A JSON file of the checkpoint, or {} when it is not there."""
    file = os.path.join(path, name)
    if not os.path.isfile(file):
        return {}
    try:
        with open(file) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{file} could not be read: {e}") from None


def _materialise_buffers(model: LlavaForServing, cfg: ModelConfig) -> None:
    """The model was built on the meta device; rebuild the non-persistent buffers no checkpoint holds."""
    emb = model.vision.vision_tower.embeddings
    emb.register_buffer("position_ids", torch.arange(emb.num_positions).expand((1, -1)), persistent=False)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise CheckpointError(f"weights not initialised after loading: {left[:8]}")


def _with_dtype(cfg: ModelConfig, dtype: torch.dtype) -> ModelConfig:
    from dataclasses import replace

    return replace(cfg, dtype=dtype)
