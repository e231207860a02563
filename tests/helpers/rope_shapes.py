"""RoPE variants the loader claims (vlserve.model.config.SUPPORTED_ROPE_TYPES), as tiny checkpoints.

Shared by the paged-model parity test (logits) and the Engine parity test (greedy ids). Each original
context is short enough that the prompts and decode steps (up to ~80 positions) reach the scaled
frequencies; LongRoPE's 32 is crossed mid-prompt by some requests and mid-decode by others.
"""

from vlserve.testing.tiny import TinyModelSpec

ROPE_SHAPES = {
    # Mistral / Qwen2 use default RoPE with theta 1e6: catches a default path that ignores rope_theta.
    "theta-1e6": TinyModelSpec(rope_theta=1e6),
    "linear": TinyModelSpec(rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "llama3": TinyModelSpec(rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}),
    "yarn": TinyModelSpec(max_position_embeddings=2048, rope_scaling={  # attention factor 1.14 on cos/sin
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}),
    "longrope": TinyModelSpec(max_position_embeddings=2048, rope_scaling={
        "rope_type": "longrope", "original_max_position_embeddings": 32,
        "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 3.0, 4.0, 6.0],
        "long_factor": [1.0, 1.5, 2.5, 4.0, 8.0, 16.0, 32.0, 64.0]}),
}
