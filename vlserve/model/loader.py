"""Loads a Hugging Face LLaVA checkpoint directory into the native serving model.

Accepts both weight-key layouts in use: the published llava-hf one
(`language_model.model.*`, `vision_tower.vision_model.*`, `multi_modal_projector.*`,
`language_model.lm_head.*`) and the ones transformers writes (`vision_tower.embeddings.*`
without the `vision_model` level; `model.language_model.*` / `lm_head.*`).
"""

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import safe_open

from vlserve.core.config import KernelConfig
from vlserve.core.errors import CheckpointError
from vlserve.cpu.gemm import native_bf16, native_fp16, use_cpu_gemm
from vlserve.model.config import ModelConfig, parse_dtype
from vlserve.model.families import Family, family_for
from vlserve.model.llava import LlavaForServing
from vlserve.model.vision import unused_checkpoint_key
from vlserve.preprocess import ImageProcessing

log = logging.getLogger(__name__)

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
    ("model.image_newline", "vision.image_newline"),  # LLaVA-NeXT
    ("image_newline", "vision.image_newline"),
    ("model.visual.", "vision."),  # Qwen-VL, as transformers writes it
    ("visual.", "vision."),  # Qwen-VL, as published (the decoder under model.)
    ("model.", "language_model."),
)


@dataclass
class LoadedModel:
    path: str
    config: ModelConfig
    model: LlavaForServing
    tokenizer: Any  # transformers PreTrainedTokenizerFast
    processor_config: dict  # preprocessor_config.json
    hf_config: Any
    dtype_note: str = ""  # how the dtype was chosen (said at start-up)
    family: Family | None = None  # the model/families.py entry it was loaded by
    image_processing: ImageProcessing | None = None  # built by the family from processor_config


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
    if (not os.path.isfile(os.path.join(path, PROCESSOR_FILE))
            and "image_processor" not in _json(path, PROCESSOR_FALLBACK)):
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


def load_model(path: str, dtype: str | torch.dtype | None = None, device: str = "cpu",
               kernels: KernelConfig = KernelConfig()) -> LoadedModel:
    """dtype: None (the checkpoint's), "auto" (see resolve_dtype) or a dtype name. kernels: the kernel
    paths the model is built with (KernelConfig; each off switch is that path's plain-PyTorch fallback)."""
    from transformers import AutoConfig, AutoTokenizer

    files = check_checkpoint_dir(path)
    try:
        hf_config = AutoConfig.from_pretrained(path)
    except (ValueError, KeyError, OSError) as e:
        raise CheckpointError(f"{path}: config.json could not be read: {e}") from e
    family = family_for(hf_config)
    cfg = family.config_from_hf(hf_config)
    chosen, note = resolve_dtype(dtype, cfg.dtype, device)
    cfg = _with_dtype(cfg, chosen)
    log.info("%s; dtype: %s", family.architecture, note)
    with torch.device("meta"):
        model = family.build_model(cfg)
    state = {k: v for k, v in read_state_dict(files, cfg.dtype).items() if not unused_checkpoint_key(k, cfg)}
    expected = set(model.state_dict().keys())
    if cfg.text.tie_word_embeddings:
        expected.discard("lm_head.weight")
        state.pop("lm_head.weight", None)
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not match the config: missing {missing[:8]}, "
                              f"unexpected {unexpected[:8]}")
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.text.tie_word_embeddings:  # assign=True replaced embed_tokens.weight; re-tie the head to it
        model.lm_head.weight = model.language_model.embed_tokens.weight
    _materialise_buffers(model, cfg)
    model.language_model.fuse_projections()
    model.language_model.use_fused_ops(kernels.fused_ops)
    model = model.to(device).eval()
    if kernels.cpu_gemm and torch.device(device).type == "cpu":
        use_cpu_gemm(model, kernels.small_gemm)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not getattr(tokenizer, "chat_template", None):  # the processor's chat_template.json, as AutoProcessor reads it
        tokenizer.chat_template = _json(path, "chat_template.json").get("chat_template")
    processor_config = _json(path, PROCESSOR_FILE) or _json(path, PROCESSOR_FALLBACK)["image_processor"]
    try:
        processing = family.image_processing(processor_config)
    except ValueError as e:
        raise CheckpointError(f"{path}: image processor config not served: {e}") from e
    return LoadedModel(path, cfg, model, tokenizer, processor_config, hf_config, note, family, processing)


def resolve_dtype(requested: str | torch.dtype | None, checkpoint: torch.dtype,
                  device: str | torch.device = "cpu") -> tuple[torch.dtype, str]:
    """The dtype to run in, and a sentence saying why.

    None: the checkpoint's. An explicit dtype: that one. "auto": the checkpoint's on a GPU; on the
    CPU, fp32 stays fp32, and a half-precision checkpoint keeps its dtype only where oneDNN has
    native kernels for it (AVX512_BF16 / AMX, AVX512_FP16) — elsewhere torch's half-precision GEMMs
    measured 3-6x slower than fp32 at prefill sizes (benchmarks/gemm_paths.py at ba1d303), so it runs in fp32.
    An fp16 checkpoint runs in bf16 wherever the CPU has native bf16 kernels: on a Xeon with AMX,
    fp16 GEMMs (AVX512_FP16) ran at fp32's rate (333 GFLOP/s, two threads) and bf16 ones at 8x that,
    and the CPU kernels' fast paths (attention blocks, decode rows) are bf16's; where there are no
    AVX512_FP16 kernels (AMD's AVX-512 CPUs) fp16 would fall back to fp32. bf16 keeps fp16's values'
    range and drops three bits of their mantissa, as vLLM's CPU backend does with fp16 checkpoints.
    """
    if requested is None:
        return checkpoint, f"{_name(checkpoint)} (the checkpoint's)"
    if requested != "auto":
        chosen = parse_dtype(requested)
        return chosen, f"{_name(chosen)} (requested)"
    if torch.device(device).type != "cpu" or checkpoint == torch.float32:
        return checkpoint, f"auto -> {_name(checkpoint)} (the checkpoint's)"
    if checkpoint == torch.float16 and native_bf16():
        return torch.bfloat16, ("auto -> bfloat16 (checkpoint is float16; this CPU's native bfloat16 GEMMs are its "
                                "fastest half-precision path; --dtype float16 keeps the checkpoint's)")
    native = {torch.bfloat16: native_bf16, torch.float16: native_fp16}[checkpoint]()
    if native:
        return checkpoint, (f"auto -> {_name(checkpoint)} (the checkpoint's; "
                            f"this CPU has native {_name(checkpoint)} GEMMs)")
    return torch.float32, (f"auto -> float32 (checkpoint is {_name(checkpoint)}, but this CPU has no native "
                           f"{_name(checkpoint)} GEMM kernels, so fp32 is faster; "
                           f"--dtype {_name(checkpoint)} forces it)")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


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
    if hasattr(model.vision, "vision_tower"):  # transformers' CLIP / SigLIP (Qwen's towers make theirs on the CPU)
        emb = model.vision.vision_tower.embeddings
        emb.register_buffer("position_ids", torch.arange(emb.num_positions).expand((1, -1)), persistent=False)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise CheckpointError(f"weights not initialised after loading: {left[:8]}")


def _with_dtype(cfg: ModelConfig, dtype: torch.dtype) -> ModelConfig:
    from dataclasses import replace

    return replace(cfg, dtype=dtype)
