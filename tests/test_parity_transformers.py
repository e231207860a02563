"""The native paged model matches transformers' LlavaForConditionalGeneration (docs/ARCHITECTURE.md, invariant 5)."""

import pytest

from helpers.runner_helpers import assert_runner_matches_transformers
from vlserve.testing.tiny import TinyModelSpec, make_tiny_model

from helpers.rope_shapes import ROPE_SHAPES

SHAPES = {
    "gqa-default": TinyModelSpec(),
    "mha-full": TinyModelSpec(num_kv_heads=4, vision_feature_select_strategy="full", vision_feature_layer=-1),
    "tied-headdim-rope": TinyModelSpec(tie_word_embeddings=True, head_dim=32, num_heads=2, num_kv_heads=1,
                                       rope_theta=500.0, vision_feature_layer=[-2, -1],
                                       rope_scaling={"rope_type": "linear", "factor": 2.0}),
    # the tower read at two inner layers: its last layer is never built (vision.kept_layers)
    "inner-feature-layers": TinyModelSpec(vision_layers=4, vision_feature_layer=[-4, -2]),
    **ROPE_SHAPES,
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return make_tiny_model(str(path), seed=1, spec=SHAPES[request.param])


@pytest.mark.parametrize("page_size", [1, 4])
def test_prefill_and_decode_logits_match_transformers(checkpoint, page_size):
    assert_runner_matches_transformers(checkpoint, page_size)
