"""Each parallel layer of vlserve/model/tensor_parallel.py against the unsharded layer it replaces,
on both ranks of a real 2-process gloo group: column- and row-parallel linears (biases), the
vocab-parallel embedding (pseudo-token ids), the LM head gathered to rank 0 (tied and not), the MLP,
and attention over the paged KV pool for GQA, MHA and fewer KV heads than ranks (replicated)."""

import pytest
import torch
import torch.multiprocessing as mp

from helpers.tp_helpers import check_all_layers
from vlserve.distributed.group import free_port
from vlserve.model.tensor_parallel import (
    TPContext, VocabParallelEmbedding, check_shardable, kv_head_range, kv_heads_per_rank, vocab_range,
)


@pytest.mark.distributed
def test_every_parallel_layer_matches_the_unsharded_one_on_two_gloo_ranks():
    mp.spawn(check_all_layers, args=(2, f"127.0.0.1:{free_port()}"), nprocs=2, join=True)


def test_shares_of_heads_and_vocabulary():
    assert [kv_head_range(2, TPContext(r, 2)) for r in range(2)] == [range(0, 1), range(1, 2)]
    assert [kv_head_range(1, TPContext(r, 4)) for r in range(4)] == [range(0, 1)] * 4  # replicated
    assert [kv_head_range(2, TPContext(r, 4)) for r in range(4)] == [range(0, 1)] * 2 + [range(1, 2)] * 2
    assert kv_heads_per_rank(8, 2) == 4 and kv_heads_per_rank(2, 4) == 1
    assert [vocab_range(11, TPContext(r, 2)) for r in range(2)] == [range(0, 6), range(6, 11)]


@pytest.mark.parametrize("heads,kv_heads,inter,tp,message", [
    (6, 6, 8, 4, "must divide the 6 attention heads"),
    (4, 4, 6, 4, "must divide the MLP size 6"),
    (12, 3, 8, 2, "one must divide the other"),
])
def test_shapes_that_do_not_shard_are_refused_by_name(heads, kv_heads, inter, tp, message):
    with pytest.raises(ValueError, match=message):
        check_shardable(heads, kv_heads, inter, tp)


def test_shard_model_cuts_the_decoder_and_leaves_the_vision_side_whole(tmp_path):
    from vlserve.model.loader import load_model
    from vlserve.model.tensor_parallel import ColumnParallelLinear, ParallelLMHead, RowParallelLinear, shard_model
    from vlserve.testing.tiny import TinyModelSpec, make_tiny_model

    path = make_tiny_model(str(tmp_path / "m"),
                           spec=TinyModelSpec(num_heads=4, num_kv_heads=2, tie_word_embeddings=True))
    model = load_model(path).model
    vision_before = {n: p.clone() for n, p in model.vision.named_parameters()}
    shard_model(model, TPContext(1, 2))  # building the shards runs no collective
    parallel = (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, ParallelLMHead)
    assert not any(isinstance(m, parallel) for m in model.vision.modules()), "no collective in the vision side"
    assert all(torch.equal(p, vision_before[n]) for n, p in model.vision.named_parameters())
    attn, mlp = model.language_model.layers[0].self_attn, model.language_model.layers[0].mlp
    assert (attn.num_heads, attn.num_kv_heads) == (2, 1)
    assert isinstance(attn.qkv_proj, ColumnParallelLinear) and isinstance(attn.o_proj, RowParallelLinear)
    assert isinstance(mlp.gate_up_proj, ColumnParallelLinear) and isinstance(mlp.down_proj, RowParallelLinear)
    assert model.lm_head.local.weight is model.language_model.embed_tokens.weight  # still tied
