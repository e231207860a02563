"""Tensor-parallel test helpers: per-layer checks that each rank of a real 2-process gloo group runs
(spawned by tests/test_tensor_parallel_layers.py), and the process checks the engine tests share."""

import copy

import torch
import torch.distributed as dist
from torch import nn

from vlserve.core.forward_batch import ExtendSlice, build_forward_batch
from vlserve.memory.kv_pool import KVPool
from vlserve.memory.req_to_token import ReqToTokenPool
from vlserve.model.attention import AttentionBackend
from vlserve.model.config import TextConfig
from vlserve.model.llama import MLP, Attention
from vlserve.model.tensor_parallel import (
    ColumnParallelLinear, ParallelLMHead, RowParallelLinear, TPContext, VocabParallelEmbedding, kv_head_range,
    shard_attention, shard_mlp,
)

ATOL = 1e-5


def text_config(heads: int, kv_heads: int, qkv_bias: bool, o_bias: bool, hidden: int = 32,
                head_dim: int = 8) -> TextConfig:
    return TextConfig(vocab_size=11, hidden_size=hidden, intermediate_size=24, num_layers=1, num_heads=heads,
                      num_kv_heads=kv_heads, head_dim=head_dim, rms_norm_eps=1e-6, max_position_embeddings=64,
                      tie_word_embeddings=False, qkv_bias=qkv_bias, o_bias=o_bias, sliding_window=None,
                      eos_token_ids=(), hf_config=None)


def check_all_layers(rank: int, world: int, init_addr: str) -> None:
    """The spawn target: every parallel layer against its unsharded original, on this rank."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{init_addr}", rank=rank, world_size=world)
    tp = TPContext(rank, world)
    try:
        for check in (check_column, check_row, check_embedding, check_lm_head, check_mlp):
            torch.manual_seed(0)  # every rank builds the same full layer and input
            check(tp)
        # GQA (Llama: no biases), MHA (biases everywhere), fewer KV heads than ranks (Qwen2: q/k/v biases only)
        for heads, kv_heads, qkv_bias, o_bias in ((4, 2, False, False), (4, 4, True, True), (4, 1, True, False)):
            torch.manual_seed(0)
            check_attention(tp, text_config(heads, kv_heads, qkv_bias, o_bias))
    finally:
        dist.destroy_process_group()


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs().max().item() if got.numel() else 0.0
    assert err <= ATOL, f"{what}: max abs difference {err}"


def check_column(tp: TPContext) -> None:
    full, x = nn.Linear(16, 12, bias=True), torch.randn(5, 16)
    # two fused sections of 6 rows, each cut in halves (as q/k/v and gate/up are)
    mine = [range(3 * tp.rank, 3 * tp.rank + 3), range(6 + 3 * tp.rank, 9 + 3 * tp.rank)]
    want = full(x)[:, [r for part in mine for r in part]]
    _close(ColumnParallelLinear(full, mine)(x), want, "column-parallel linear")


def check_row(tp: TPContext) -> None:
    full, x = nn.Linear(12, 16, bias=True), torch.randn(5, 12)
    cols = range(6 * tp.rank, 6 * tp.rank + 6)
    _close(RowParallelLinear(full, cols, tp)(x[:, cols.start:cols.stop]), full(x), "row-parallel linear (bias once)")


def check_embedding(tp: TPContext) -> None:
    full = nn.Embedding(11, 8)  # odd vocabulary: the last rank's share is short
    ids = torch.tensor([0, 5, 6, 10, 3, 11, 2**40 + 7])  # the last two: pseudo-token ids (>= vocab)
    want = full(ids.clamp(max=10))
    want[5:] = 0
    with torch.no_grad():
        _close(VocabParallelEmbedding(full, tp)(ids), want, "vocab-parallel embedding")


def check_lm_head(tp: TPContext) -> None:
    full, hidden = nn.Linear(8, 11, bias=False), torch.randn(3, 8)
    got = ParallelLMHead(full, tp)(hidden)
    if tp.rank == 0:
        _close(got, full(hidden), "LM head gathered to rank 0")
    else:
        assert got.numel() == 0, "only rank 0 receives logits"
    emb = nn.Embedding(11, 8)  # tied: the head shares the embedding's shard
    full.weight = emb.weight
    vocab_emb = VocabParallelEmbedding(emb, tp)
    head = ParallelLMHead(full, tp, tied=vocab_emb)
    assert head.local.weight is vocab_emb.weight
    got = head(hidden)
    if tp.rank == 0:
        _close(got, full(hidden), "tied LM head")


def check_mlp(tp: TPContext) -> None:
    full, x = MLP(text_config(4, 2, False, False)), torch.randn(6, 32)
    full.fuse()
    sharded = copy.deepcopy(full)
    shard_mlp(sharded, tp)
    with torch.no_grad():
        _close(sharded(x), full(x), "MLP (gate/up column, down row)")


def check_attention(tp: TPContext, cfg: TextConfig) -> None:
    """An extend of two requests then a decode step over the paged pool: same output as the whole
    layer, and this rank's KV pool holds exactly its KV heads of the whole pool."""
    full = Attention(cfg, layer_id=0)
    full.fuse()
    sharded = copy.deepcopy(full)
    shard_attention(sharded, tp)
    heads = kv_head_range(cfg.num_kv_heads, tp)
    full_kv = KVPool.create(1, 32, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    local_kv = KVPool.create(1, 32, len(heads), cfg.head_dim, torch.float32)
    table = ReqToTokenPool(2, 32)
    rows = [table.alloc(), table.alloc()]
    backend = AttentionBackend("reference")
    name = f"attention heads={cfg.num_heads} kv_heads={cfg.num_kv_heads} biases={cfg.qkv_bias, cfg.o_bias}"
    next_slot, lens = 0, [0, 0]
    for step_lens in ((5, 3), (1, 1)):
        slices = []
        for i, n in enumerate(step_lens):
            slots = torch.arange(next_slot, next_slot + n)
            next_slot += n
            table.write(rows[i], lens[i], slots)
            slices.append(ExtendSlice(rows[i], lens[i], [1] * n, slots))
            lens[i] += n
        batch = build_forward_batch(slices, table.table, cfg.vocab_size)
        t = batch.input_ids.shape[0]
        x, cos, sin = torch.randn(t, cfg.hidden_size), torch.randn(t, cfg.head_dim), torch.randn(t, cfg.head_dim)
        with torch.no_grad():
            want = full(x, cos, sin, batch, full_kv, backend)
            got = sharded(x, cos, sin, batch, local_kv, backend)
        _close(got, want, name)
        written = torch.arange(next_slot)
        _close(local_kv.k_buffers[0][written], full_kv.k_buffers[0][written][:, heads.start:heads.stop],
               name + ": this rank's K heads")


def process_gone(pid: int) -> bool:
    """No such process, or only a zombie not yet reaped by its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True
