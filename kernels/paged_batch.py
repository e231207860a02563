"""Random paged batches for testing and benchmarking the attention kernels.

Slots are handed out in pages of page_size contiguous slots, pages in random order (page_size=1 is a
random permutation of slots). req_to_token rows are random rows of the table, and every cell past a
request's length holds a valid but unrelated slot, so reading past seq_len changes the result.
"""

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    q: torch.Tensor  # [sum(extend_lens), Hq, D]: the new tokens, request after request
    k_buffer: torch.Tensor  # [num_slots, Hkv, D]
    v_buffer: torch.Tensor
    req_to_token: torch.Tensor  # [max_requests, max_context_len] int32
    req_pool_indices: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B]
    extend_lens: torch.Tensor  # [B]
    qo_start_loc: torch.Tensor  # [B]
    sm_scale: float

    def decode(self, attention, num_kv_splits=None) -> torch.Tensor:
        """Run decode_attention or decode_attention_ref (a decode batch: extend_lens all 1)."""
        o = torch.empty_like(self.q)
        attention(self.q, self.k_buffer, self.v_buffer, o, self.req_to_token, self.req_pool_indices,
                  self.seq_lens, self.sm_scale, num_kv_splits)
        return o

    def extend(self, attention) -> torch.Tensor:
        """Run extend_attention or extend_attention_ref."""
        o = torch.empty_like(self.q)
        attention(self.q, self.k_buffer, self.v_buffer, o, self.req_to_token, self.req_pool_indices,
                  self.seq_lens, self.extend_lens, self.qo_start_loc, self.sm_scale)
        return o


def random_paged_batch(seq_lens: list[int], extend_lens: list[int] | None, num_q_heads: int, num_kv_heads: int,
                       head_dim: int, dtype: torch.dtype, page_size: int = 1, device: str | torch.device = "cpu",
                       seed: int = 0, index_dtype: torch.dtype = torch.int32, spare_pages: int = 3) -> PagedBatch:
    """A batch whose request b has seq_lens[b] tokens in the pool, the last extend_lens[b] of them new
    (extend_lens=None: one new token each, a decode batch)."""
    extend_lens = [1] * len(seq_lens) if extend_lens is None else extend_lens
    if len(extend_lens) != len(seq_lens) or any(not 1 <= e <= s for s, e in zip(seq_lens, extend_lens)):
        raise ValueError(f"need 1 <= extend_lens[b] <= seq_lens[b], got {extend_lens} and {seq_lens}")
    gen = torch.Generator().manual_seed(seed)
    batch = len(seq_lens)
    pages_per_req = [-(-s // page_size) for s in seq_lens]
    num_pages = sum(pages_per_req) + spare_pages
    num_slots = num_pages * page_size
    max_requests, width = batch + 3, max(seq_lens) + 5

    page_order = torch.randperm(num_pages, generator=gen)
    req_to_token = torch.randint(0, num_slots, (max_requests, width), generator=gen, dtype=torch.int32)
    rows = torch.randperm(max_requests, generator=gen)[:batch]
    first_page = 0
    for row, seq_len, num_req_pages in zip(rows.tolist(), seq_lens, pages_per_req):
        pages = page_order[first_page:first_page + num_req_pages]
        first_page += num_req_pages
        positions = torch.arange(seq_len)
        req_to_token[row, :seq_len] = (pages[positions // page_size] * page_size + positions % page_size).int()

    device_gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=device_gen, device=device).to(dtype)

    starts = torch.tensor([0] + extend_lens[:-1]).cumsum(0)
    return PagedBatch(
        q=randn(sum(extend_lens), num_q_heads, head_dim),
        k_buffer=randn(num_slots, num_kv_heads, head_dim),
        v_buffer=randn(num_slots, num_kv_heads, head_dim),
        req_to_token=req_to_token.to(device),
        req_pool_indices=rows.to(torch.int64).to(device),
        seq_lens=torch.tensor(seq_lens, dtype=index_dtype, device=device),
        extend_lens=torch.tensor(extend_lens, dtype=index_dtype, device=device),
        qo_start_loc=starts.to(index_dtype).to(device),
        sm_scale=head_dim ** -0.5,
    )


def share_prefixes(batch: PagedBatch, groups: list[tuple[list[int], int]]) -> PagedBatch:
    """Give the requests of each group (indices into the batch, keys) the first member's slots for
    their first `keys` positions, as the radix cache does for requests that share a prompt prefix.
    The other members' own slots for those positions are left in the pool, unread."""
    rows = batch.req_pool_indices.tolist()
    for members, keys in groups:
        lens = [int(batch.seq_lens[m]) for m in members]
        if keys > min(lens):
            raise ValueError(f"group {members} cannot share {keys} keys: its shortest request has {min(lens)}")
        for m in members[1:]:
            batch.req_to_token[rows[m], :keys] = batch.req_to_token[rows[members[0]], :keys]
    return batch
