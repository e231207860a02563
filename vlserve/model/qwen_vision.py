"""The Qwen2-VL and Qwen2.5-VL vision towers: native-resolution patches → merged embeddings for the LM.

Same maths as transformers' Qwen2VisionTransformerPretrainedModel / Qwen2_5_VisionTransformer...:
- the patch embedding is a Conv3d whose kernel equals its stride, i.e. one linear map of each
  flattened (channel, frame, row, column) patch, which is how it runs here;
- a 2-D rotary over each patch's (row, column) in the image, in float32;
- blocks of bidirectional attention; each temporal patch (a picture, or a video's frame pair)
  attends only within itself, so the tower runs frame pairs independently (what lets a video's keys
  go per temporal patch). Qwen2.5-VL attends within windows of window_size pixels in most blocks
  and over the whole frame pair in fullatt_block_indexes;
- the merger: a norm, then each 2x2 block of neighbouring patches concatenated and projected.
An item's pixels come as transformers' pixel_values rows for it, shaped [t, h, w, C*tp*p*p] (its
grid in the shape; the rows in the processor's order: frame pair, then 2x2 block, then patch).
The attention runs on our batched CPU kernel (causal=False, one "request" per attended group).
"""

import torch
from torch import nn
from transformers.activations import ACT2FN

from vlserve.kernels.cpu_attention import extend_attention_cpu
from vlserve.model.llama import RMSNorm


def grid_of(pixels: torch.Tensor) -> tuple[int, int, int]:
    if pixels.dim() != 4:
        raise ValueError(f"Qwen-VL pixels must be [t, h, w, patch] (the grid in the shape), got {tuple(pixels.shape)}")
    t, h, w, _ = pixels.shape
    return t, h, w


def patch_positions(grid: tuple[int, int, int], merge: int) -> torch.Tensor:
    """[t*h*w, 2] (row, column) of each patch in the processor's order (2x2 blocks row-major)."""
    t, h, w = grid
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    block = (h // merge, merge, w // merge, merge)
    rows, cols = (x.reshape(block).transpose(1, 2).flatten() for x in (rows, cols))
    return torch.stack([rows, cols], dim=-1).repeat(t, 1)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int], scale: float
                     ) -> torch.Tensor:
    """q/k/v [T, H, D]; each consecutive group of `lengths` tokens attends to all of itself."""
    total, longest = q.shape[0], max(lengths)
    starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
    table = (starts[:, None] + torch.arange(longest)[None, :]).clamp(max=total - 1).to(torch.int32)
    lens = torch.tensor(lengths, dtype=torch.int64)
    out = torch.empty_like(q)
    extend_attention_cpu(q.contiguous(), k.contiguous(), v.contiguous(), out, table, torch.arange(len(lengths)),
                         lens, lens, starts, scale, causal=False)
    return out


def rotate_vision(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated in float32 (as transformers' apply_rotary_pos_emb_vision), back to its dtype."""
    xf = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)


class PatchEmbed(nn.Module):
    def __init__(self, vc):
        super().__init__()
        p, tp = vc.patch_size, vc.temporal_patch_size
        self.embed_dim = getattr(vc, "embed_dim", None) or vc.hidden_size
        self.proj = nn.Module()
        self.proj.weight = nn.Parameter(torch.empty(self.embed_dim, vc.in_channels, tp, p, p))
        bias = getattr(vc, "model_type", "") == "qwen3_vl_vision"  # Qwen3-VL's Conv3d has a bias
        self.proj.bias = nn.Parameter(torch.empty(self.embed_dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.proj.weight
        return nn.functional.linear(x.to(w.dtype), w.reshape(self.embed_dim, -1), self.proj.bias)


class VisionRotary(nn.Module):
    def __init__(self, vc, head_dim: int):
        super().__init__()
        theta = (getattr(vc, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        spatial = head_dim // 2
        with torch.device("cpu"):
            inv_freq = 1.0 / (theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [N, 2] (row, column) → cos, sin [N, head_dim] float32."""
        freqs = positions[..., None].float() * self.inv_freq.to(positions.device)  # [N, 2, dim/4]
        freqs = freqs.reshape(positions.shape[0], -1)  # rows' frequencies, then columns'
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class VisionAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, cos, sin, lengths: list[int]):
        t = x.shape[0]
        q, k, v = self.qkv(x).reshape(t, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = rotate_vision(q, cos, sin), rotate_vision(k, cos, sin)
        o = varlen_attention(q, k, v, lengths, self.head_dim ** -0.5)
        return self.proj(o.reshape(t, -1))


class QuickMlp(nn.Module):
    """Qwen2-VL's: fc1, activation, fc2."""

    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), ACT2FN[act], nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class GatedMlp(nn.Module):
    """Qwen2.5-VL's: down(act(gate(x)) * up(x)), every projection with a bias."""

    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(dim, hidden), nn.Linear(dim, hidden)
        self.down_proj, self.act = nn.Linear(hidden, dim), ACT2FN[act]

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp: nn.Module, norm):
        super().__init__()
        self.norm1, self.norm2 = norm(dim), norm(dim)
        self.attn = VisionAttention(dim, num_heads)
        self.mlp = mlp

    def forward(self, x, cos, sin, lengths):
        x = x + self.attn(self.norm1(x), cos, sin, lengths)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    def __init__(self, out_dim: int, dim: int, merge: int, norm):
        super().__init__()
        self.hidden = dim * merge ** 2
        self.ln_q = norm(dim)
        self.mlp = nn.Sequential(nn.Linear(self.hidden, self.hidden), nn.GELU(), nn.Linear(self.hidden, out_dim))

    def forward(self, x):
        return self.mlp(self.ln_q(x).view(-1, self.hidden))


def _layer_norm(dim: int) -> nn.Module:
    return nn.LayerNorm(dim, eps=1e-6)


def _rms_norm(dim: int) -> nn.Module:
    norm = RMSNorm(dim, 1e-6)
    norm.fused_ops = False  # the tower's rows are few; transformers' eager arithmetic, exactly
    return norm


class Qwen2VisionTower(nn.Module):
    """Qwen2-VL's tower. Qwen2.5-VL's (Qwen25VisionTower) differs in its norms, MLP and windows."""

    def __init__(self, cfg):
        """cfg: a model/config.py ModelConfig (its vision_hf_config is transformers' vision config)."""
        super().__init__()
        vc = cfg.vision_hf_config
        self.merge = vc.spatial_merge_size
        dim = getattr(vc, "embed_dim", None) or vc.hidden_size
        self.patch_embed = PatchEmbed(vc)
        self.rotary_pos_emb = VisionRotary(vc, dim // vc.num_heads)
        self.blocks = nn.ModuleList(self._block(vc, dim) for _ in range(vc.depth))
        self.merger = PatchMerger(self._out_dim(vc), dim, self.merge, self._norm)

    _norm = staticmethod(_layer_norm)

    def _block(self, vc, dim: int) -> VisionBlock:
        return VisionBlock(dim, vc.num_heads, QuickMlp(dim, int(dim * vc.mlp_ratio), vc.hidden_act), self._norm)

    @staticmethod
    def _out_dim(vc) -> int:
        return vc.hidden_size

    def encode(self, pixel_values: list[torch.Tensor], image_sizes: list, roles: list | None = None
               ) -> list[torch.Tensor]:
        """As LlavaForServing.encode_images calls its vision part (sizes and roles do not matter here)."""
        return self(pixel_values)

    def forward(self, pixels: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each item's [t, h, w, patch] pixels → its merged embeddings [t*h*w / merge², out_dim]."""
        grids = [grid_of(p) for p in pixels]
        x = self.patch_embed(torch.cat([p.reshape(-1, p.shape[-1]) for p in pixels]))
        positions = torch.cat([patch_positions(g, self.merge) for g in grids]).to(x.device)
        cos, sin = self.rotary_pos_emb(positions)
        x = self.run_blocks(x, cos, sin, grids)
        merged = self.merger(x)
        return list(merged.split([t * h * w // self.merge ** 2 for t, h, w in grids]))

    def run_blocks(self, x, cos, sin, grids) -> torch.Tensor:
        lengths = [h * w for t, h, w in grids for _ in range(t)]  # each frame pair attends within itself
        for block in self.blocks:
            x = block(x, cos, sin, lengths)
        return x


def window_layout(grid: tuple[int, int, int], merge: int, window: int) -> tuple[torch.Tensor, list[int]]:
    """Qwen2.5-VL's windows over one item: the order of its merged units that puts each window's
    units together (frame pair by frame pair, windows row-major, units row-major within), and each
    window's length in patches. `window` is in merged units per side."""
    t, h, w = grid
    gh, gw = h // merge, w // merge
    order, lengths = [], []
    units = torch.arange(t * gh * gw).reshape(t, gh, gw)
    for frame in units:
        for top in range(0, gh, window):
            for left in range(0, gw, window):
                cell = frame[top:top + window, left:left + window].reshape(-1)
                order.append(cell)
                lengths.append(cell.numel() * merge * merge)
    return torch.cat(order), lengths


class Qwen25VisionTower(Qwen2VisionTower):
    """Qwen2.5-VL: RMSNorms, a gated MLP with biases, and window attention except in
    fullatt_block_indexes. The patches are put in window order once (by merged unit, so the merger's
    2x2 units stay whole), the blocks run, and the merged rows are put back in the processor's order."""

    _norm = staticmethod(_rms_norm)

    def __init__(self, cfg):
        super().__init__(cfg)
        vc = cfg.vision_hf_config
        self.full_blocks = frozenset(vc.fullatt_block_indexes)
        self.window = vc.window_size // self.merge // vc.patch_size

    def _block(self, vc, dim: int) -> VisionBlock:
        return VisionBlock(dim, vc.num_heads, GatedMlp(dim, vc.intermediate_size, vc.hidden_act), self._norm)

    @staticmethod
    def _out_dim(vc) -> int:
        return vc.out_hidden_size

    def forward(self, pixels: list[torch.Tensor]) -> list[torch.Tensor]:
        grids = [grid_of(p) for p in pixels]
        unit = self.merge ** 2
        orders, windows, first = [], [], 0
        for grid in grids:
            order, lengths = window_layout(grid, self.merge, self.window)
            orders.append(order + first)
            windows += lengths
            first += order.numel()
        order = torch.cat(orders)
        x = self.patch_embed(torch.cat([p.reshape(-1, p.shape[-1]) for p in pixels]))
        positions = torch.cat([patch_positions(g, self.merge) for g in grids]).to(x.device)
        cos, sin = self.rotary_pos_emb(positions)
        by_window = lambda a: a.reshape(-1, unit, a.shape[-1])[order].reshape(-1, a.shape[-1])  # noqa: E731
        x, cos, sin = by_window(x), by_window(cos), by_window(sin)
        frames = [h * w for t, h, w in grids for _ in range(t)]
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, frames if i in self.full_blocks else windows)
        merged = self.merger(x)[torch.argsort(order)]
        return list(merged.split([t * h * w // unit for t, h, w in grids]))


class FcMlp(nn.Module):
    """Qwen3-VL's: linear_fc1, activation, linear_fc2."""

    def __init__(self, dim: int, hidden: int, act: str, out_dim: int | None = None):
        super().__init__()
        self.linear_fc1, self.act_fn = nn.Linear(dim, hidden), ACT2FN[act]
        self.linear_fc2 = nn.Linear(hidden, out_dim or dim)

    def forward(self, x):
        return self.linear_fc2(self.act_fn(self.linear_fc1(x)))


class Qwen3PatchMerger(nn.Module):
    """The norm over each patch (the final merger) or over each merged 2x2 unit (DeepStack's), then
    the unit's concatenated patches through an MLP."""

    def __init__(self, dim: int, out_dim: int, merge: int, after_merge: bool):
        super().__init__()
        self.hidden, self.after_merge = dim * merge ** 2, after_merge
        self.norm = nn.LayerNorm(self.hidden if after_merge else dim, eps=1e-6)
        self.linear_fc1, self.act_fn = nn.Linear(self.hidden, self.hidden), nn.GELU()
        self.linear_fc2 = nn.Linear(self.hidden, out_dim)

    def forward(self, x):
        x = self.norm(x.view(-1, self.hidden)) if self.after_merge else self.norm(x).view(-1, self.hidden)
        return self.linear_fc2(self.act_fn(self.linear_fc1(x)))


def bilinear_matrix(size: int, side: int) -> torch.Tensor:
    """[size, side]: the weights that resample `side` points to `size` with align_corners=True."""
    src = torch.arange(size, dtype=torch.float32) * (side - 1) / max(size - 1, 1)
    low = src.floor()
    frac = src - low
    m = torch.zeros(size, side)
    rows = torch.arange(size)
    m.index_put_((rows, low.long().clamp(0, side - 1)), 1 - frac, accumulate=True)
    m.index_put_((rows, (low.long() + 1).clamp(0, side - 1)), frac, accumulate=True)
    return m


class Qwen3VisionTower(nn.Module):
    """Qwen3-VL's tower: a learned square grid of position embeddings resampled (bilinear) to each
    picture's patch grid and added to the patches, the 2-D rotary, LayerNorm blocks attending within
    each frame pair, and DeepStack: after each block in deepstack_visual_indexes, a merger of its own
    turns that block's output into features the decoder adds at the same rows in its first layers.
    Each item's embeddings are [tokens, out_dim * (1 + DeepStack levels)]: the LM's input, then each
    level's features (one tensor, so the vision cache, chunking and TP messages carry them whole)."""

    def __init__(self, cfg):
        super().__init__()
        vc = cfg.vision_hf_config
        self.merge, dim = vc.spatial_merge_size, vc.hidden_size
        self.patch_embed = PatchEmbed(vc)
        self.pos_embed = nn.Embedding(vc.num_position_embeddings, dim)
        self.side = int(vc.num_position_embeddings ** 0.5)
        self.rotary_pos_emb = VisionRotary(vc, dim // vc.num_heads)
        self.blocks = nn.ModuleList(VisionBlock(dim, vc.num_heads, FcMlp(dim, vc.intermediate_size, vc.hidden_act),
                                                _layer_norm) for _ in range(vc.depth))
        self.merger = Qwen3PatchMerger(dim, vc.out_hidden_size, self.merge, after_merge=False)
        self.deepstack_visual_indexes = list(vc.deepstack_visual_indexes)
        self.deepstack_merger_list = nn.ModuleList(
            Qwen3PatchMerger(dim, vc.out_hidden_size, self.merge, after_merge=True)
            for _ in self.deepstack_visual_indexes)

    encode = Qwen2VisionTower.encode

    def grid_embeddings(self, grid: tuple[int, int, int], positions: torch.Tensor) -> torch.Tensor:
        """The learned grid resampled to (h, w), at each patch's (row, column): [t*h*w, dim]."""
        t, h, w = grid
        table = self.pos_embed.weight.view(self.side, self.side, -1).float()
        rows, cols = bilinear_matrix(h, self.side), bilinear_matrix(w, self.side)
        resampled = torch.einsum("hi,ijc,wj->hwc", rows.to(table.device), table, cols.to(table.device))
        return resampled[positions[:, 0], positions[:, 1]].to(self.pos_embed.weight.dtype)

    def forward(self, pixels: list[torch.Tensor]) -> list[torch.Tensor]:
        grids = [grid_of(p) for p in pixels]
        x = self.patch_embed(torch.cat([p.reshape(-1, p.shape[-1]) for p in pixels]))
        per_item = [patch_positions(g, self.merge).to(x.device) for g in grids]
        x = x + torch.cat([self.grid_embeddings(g, pos) for g, pos in zip(grids, per_item)]).to(x.dtype)
        cos, sin = self.rotary_pos_emb(torch.cat(per_item))
        lengths = [h * w for t, h, w in grids for _ in range(t)]
        levels = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, lengths)
            if i in self.deepstack_visual_indexes:
                levels.append(self.deepstack_merger_list[self.deepstack_visual_indexes.index(i)](x))
        merged = torch.cat([self.merger(x), *levels], dim=-1)
        return list(merged.split([t * h * w // self.merge ** 2 for t, h, w in grids]))
