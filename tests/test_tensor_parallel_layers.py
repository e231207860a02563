"""Each parallel layer of vlserve/model/tensor_parallel.py against the unsharded layer it replaces,
on both ranks of a real 2-process gloo group: column- and row-parallel linears (biases), the
vocab-parallel embedding (pseudo-token ids), the LM head gathered to rank 0 (tied and not), the MLP,
and attention over the paged KV pool for GQA, MHA and fewer KV heads than ranks (replicated)."""

import pytest
import torch.multiprocessing as mp

from tp_helpers import check_all_layers
from vlserve.distributed.group import free_port
from vlserve.model.tensor_parallel import check_shardable, kv_head_range, kv_heads_per_rank, TPContext, vocab_range


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
