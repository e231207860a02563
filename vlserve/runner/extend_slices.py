"""A planned extend as the model sees it (an ExtendSlice), and prompt logprobs read back from it."""

import torch

from vlserve.core.forward_batch import ExtendSlice
from vlserve.core.request import Req
from vlserve.core.step import PlannedExtend
from vlserve.runner.image_embedder import ImageEmbedder


def extend_slice(p: PlannedExtend, embeds: dict[bytes, torch.Tensor]) -> ExtendSlice:
    req, start, end = p.req, p.req.kv_len, p.req.kv_len + p.num_tokens
    rows, emb = ImageEmbedder.rows_and_embeds(req, start, end, embeds) if req.images else ([], None)
    mrope = None if req.mrope is None else req.mrope.rows(start, end)
    return ExtendSlice(req.req_row, start, req.seq[start:end], p.slots, emb, rows, _logits_from(req, start, end),
                       mrope)


def _logits_from(req: Req, start: int, end: int) -> int:
    """First row of [start, end) whose logits score a prompt token (return_logprob with
    logprob_start_len), or -1 for the last row only."""
    if not (req.return_logprob and req.logprob_start_len >= 0 and start < len(req.input_ids) - 1):
        return -1
    first = max(req.logprob_start_len - 1, start)  # logits at q score the token at q + 1
    return first - start if first < end - 1 else -1


def prompt_logprobs(req: Req, s: ExtendSlice, logits: torch.Tensor) -> list[tuple[float, int, list]]:
    """(logprob, token, top alternatives) of each prompt token q+1 under the logits at q, for the slice's
    logits rows; the alternatives are req.top_logprobs_num (logprob, id) pairs, best first."""
    positions = range(s.prefix_len + s.logits_from, s.prefix_len + len(s.ids))
    vocab = logits.shape[1]  # image positions hold pseudo-token ids: no logprob for them
    targets = [(i, q + 1) for i, q in enumerate(positions)
               if q + 1 < len(req.input_ids) and req.input_ids[q + 1] < vocab]
    if not targets:
        return []
    logprobs = torch.log_softmax(logits[[i for i, _ in targets]], dim=-1)
    ids = [req.input_ids[q] for _, q in targets]
    values = logprobs.gather(1, torch.tensor(ids)[:, None]).squeeze(1).tolist()
    tops = [[] for _ in ids]
    if req.top_logprobs_num > 0:
        top_values, top_ids = logprobs.topk(req.top_logprobs_num, dim=-1)
        tops = [list(zip(v, t)) for v, t in zip(top_values.tolist(), top_ids.tolist())]
    return list(zip(values, ids, tops))
