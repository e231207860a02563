"""The KV space each system gets in a workloads run: the same number of token slots, said in each
system's own unit (vlserve: --max-total-tokens; vLLM: kv_cache_memory_bytes; llama.cpp: -c tokens)."""

import json
import os

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _text_config(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    return config.get("text_config", config)


def context_length(model_dir: str) -> int:
    """The decoder's max_position_embeddings (what a peer's longest sequence may be)."""
    return _text_config(model_dir)["max_position_embeddings"]


def kv_bytes_per_token(model_dir: str, dtype: str) -> int:
    """Keys and values of one token over every decoder layer, in `dtype`."""
    text = _text_config(model_dir)
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    kv_heads = text.get("num_key_value_heads") or text["num_attention_heads"]
    return 2 * text["num_hidden_layers"] * kv_heads * head_dim * DTYPE_BYTES[dtype]
