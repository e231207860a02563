"""What the router needs of a checkpoint, without its weights: the tokenizer (with its chat
template), the model config (image token id, tokens per image, vocabulary size) and the image
processor config. Read from the same files, through the same family table (model/families.py), as
the engine's loader (vlserve/model/loader.py)."""

import json
import os
from dataclasses import dataclass

from vlserve.model.config import ModelConfig
from vlserve.model.families import family_for

PROCESSOR_FILE = "preprocessor_config.json"
PROCESSOR_FALLBACK = "processor_config.json"
VIDEO_PROCESSOR_FILE = "video_preprocessor_config.json"


@dataclass
class ModelFiles:
    path: str
    tokenizer: object  # transformers PreTrainedTokenizerFast
    config: ModelConfig
    processor_config: dict
    image_processing: object  # what the checkpoint's family builds from its processor configs, as the loader does

    @classmethod
    def read(cls, path: str, chat_template: str | None = None) -> "ModelFiles":
        from transformers import AutoConfig, AutoTokenizer

        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"{path!r} is not a model directory (no config.json): the router reads the "
                             "tokenizer, chat template and image processor config from it")
        tokenizer = AutoTokenizer.from_pretrained(path)
        if chat_template:
            with open(chat_template) as f:
                tokenizer.chat_template = f.read()
        elif not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = _json(path, "chat_template.json").get("chat_template")
        processor = _json(path, PROCESSOR_FILE) or _json(path, PROCESSOR_FALLBACK).get("image_processor", {})
        hf_config = AutoConfig.from_pretrained(path)
        family = family_for(hf_config)  # the loader's table: anyres families key (and count) images their way
        processing = family.processing(processor, _json(path, VIDEO_PROCESSOR_FILE) or None)
        return cls(path, tokenizer, family.config_from_hf(hf_config), processor, processing)


def _json(path: str, name: str) -> dict:
    file = os.path.join(path, name)
    if not os.path.isfile(file):
        return {}
    with open(file) as f:
        return json.load(f)
