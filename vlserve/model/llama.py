"""A Llama-style decoder whose attention reads and writes KV through the paged pool.

Same maths as transformers' LlamaModel (RMSNorm, RoPE with the config's rope_parameters, GQA,
SiLU MLP), over a flat [T, hidden] batch of ragged requests instead of [B, S, hidden]. Mistral and
Qwen2 are the same decoder: they differ only in the attention biases (TextConfig.qkv_bias / o_bias:
Qwen2 has q/k/v biases and none on o_proj) and Mistral's sliding window, which the engine honours by
capping the context at the window (ModelConfig.context_limit).
"""

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from vlserve.kernels.fused import fused_op
from vlserve.memory.kv_pool import KVPool
from vlserve.model.attention import AttentionBackend
from vlserve.model.config import TextConfig
from vlserve.model.quantized_linear import Int8Linear, QuantizedLinear, QuantizedRows, fuse_quantized
from vlserve.core.forward_batch import ForwardBatch


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.fused_ops = True  # KernelConfig.fused_ops: off, the eager PyTorch below

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        op, weight = self._fused(x)
        if op is not None:
            return op.rms_norm(x, weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x.to(dtype)

    def add_and_norm(self, x: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + a, self(x + a)): the residual add and the norm after it, one pass where fused."""
        op, weight = self._fused(x)
        if op is not None and a.shape == x.shape and a.dtype == x.dtype:
            return op.add_rms_norm(x, a, weight, self.eps)
        x = x + a
        return x, self(x)

    def quantized(self, x: torch.Tensor, a: torch.Tensor | None) -> tuple[torch.Tensor, QuantizedRows] | None:
        """For a W8A8 projection after the norm: (x + a, or x where a is None; the norm's output as int8
        rows), the quantization in the norm's pass (the same bytes as quantizing its bf16/fp32 output
        apart). None where the fused kernels do not run here."""
        op, weight = self._fused(x)
        if op is None:
            return None
        if a is None:
            q, scale = op.rms_norm_quant(x, weight, self.eps)
            return x, QuantizedRows(q, scale, x.dtype)
        if a.shape != x.shape or a.dtype != x.dtype:
            return None
        stream, q, scale = op.add_rms_norm_quant(x, a, weight, self.eps)
        return stream, QuantizedRows(q, scale, x.dtype)

    def _fused(self, x: torch.Tensor):
        """(the fused ops or None, the weight), the weight read from its dict (Module.__getattr__: ~0.3 us)."""
        weight = self._parameters["weight"]
        if not self.fused_ops or x.dim() != 2 or x.stride(-1) != 1 or weight.dtype != x.dtype:
            return None, weight
        return fused_op(x), weight


class RotaryEmbedding(nn.Module):
    """cos/sin per token. LongRoPE (Phi-3) has two frequency sets: transformers rotates a forward with
    the long set once its sequence is longer than original_max_position_embeddings, the short set
    otherwise; here that is decided per request, from the request's length after this forward (so a
    request is rotated as transformers rotates it alone, unchunked, without a cached prefix)."""

    def __init__(self, hf_text_config, head_dim: int, mrope_section: tuple[int, ...] | None = None,
                 mrope_interleaved: bool = False):
        super().__init__()
        self.long_after = None  # LongRoPE only: a request longer than this uses long_inv_freq
        with torch.device("cpu"):  # real even when the model is built on the meta device for loading
            inv_freq = self._inv_freq(hf_text_config, head_dim)
            long_inv_freq = self._long_inv_freq(hf_text_config)
            axes = None if mrope_section is None else mrope_axes(mrope_section, mrope_interleaved)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("long_inv_freq", long_inv_freq, persistent=False)
        # M-RoPE: which of (temporal, height, width) positions turns each of the head's dimensions
        self.register_buffer("mrope_axes", axes, persistent=False)

    def _inv_freq(self, hf_text_config, head_dim: int) -> torch.Tensor:
        rope = getattr(hf_text_config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
        rope_type = rope.get("rope_type", "default")
        if rope_type == "default":
            inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
            self.scaling = 1.0
        else:
            inv_freq, self.scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_text_config, "cpu")
        return inv_freq

    def _long_inv_freq(self, hf_text_config) -> torch.Tensor:
        rope = getattr(hf_text_config, "rope_parameters", None) or {}
        if rope.get("rope_type") != "longrope":
            return torch.empty(0)
        self.long_after = rope["original_max_position_embeddings"]
        return ROPE_INIT_FUNCTIONS["longrope"](hf_text_config, "cpu", seq_len=self.long_after + 1)[0]

    def forward(self, positions: torch.Tensor, dtype: torch.dtype,
                seq_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T], or [3, T] (temporal, height, width) for M-RoPE; seq_lens: [T], each token's
        request length after this forward (LongRoPE)."""
        if positions.dim() == 2:
            return self._mrope_cos_sin(positions, dtype)
        if self.long_after is not None and seq_lens is not None:
            inv_freq = torch.where((seq_lens > self.long_after)[:, None], self.long_inv_freq[None, :],
                                   self.inv_freq[None, :])
            return self._cos_sin(positions, inv_freq, dtype)
        # One set of frequencies: every position's cos/sin is a row of one table, computed once up to
        # the longest position seen (doubling), and each forward only gathers its rows: the same
        # arithmetic (torch's vector and scalar cos may differ in the last bit, as between batch
        # sizes before). Computing cos and sin per forward took ~0.2 ms each, a forward.
        needed = int(positions.max()) + 1 if positions.numel() else 0
        table = self.__dict__.get("_table")
        if (table is None or table[0].shape[0] < needed or table[0].dtype != dtype
                or table[0].device != positions.device):
            rows = max(needed, 2 * table[0].shape[0] if table is not None else 0, 256)
            all_positions = torch.arange(rows, device=positions.device)
            table = self._cos_sin(all_positions, self.inv_freq[None, :], dtype)
            self.__dict__["_table"] = table  # a plain attribute: not a buffer, not in the state dict
        return table[0].index_select(0, positions), table[1].index_select(0, positions)  # a third of [positions]

    def _mrope_cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Each dimension's cos/sin at the position of its axis: three rows of the one table, picked
        per column (the same values transformers' recomposition of three frequency sets gives)."""
        if self.mrope_axes is None:
            raise ValueError("[3, T] positions given to a rotary without mrope_section")
        cos, sin = self(positions.reshape(-1), dtype)
        index = self.mrope_axes.to(positions.device)[None, None, :].expand(1, positions.shape[1], -1)
        pick = lambda table: table.view(3, positions.shape[1], -1).gather(0, index)[0]  # noqa: E731
        return pick(cos), pick(sin)

    def _cos_sin(self, positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scaling).to(dtype), (emb.sin() * self.scaling).to(dtype)


def mrope_axes(section: tuple[int, ...], interleaved: bool) -> torch.Tensor:
    """[head_dim] int64: the axis (0 temporal, 1 height, 2 width) whose position turns each dimension.
    section counts frequencies per axis (they sum to head_dim / 2); both halves of the head repeat it.
    Qwen2-VL and Qwen2.5-VL give each axis a contiguous block of frequencies; Qwen3-VL interleaves
    them (T H W T H W ..., the temporal axis keeping the frequencies past 3 x the others' counts)."""
    half = sum(section)
    if interleaved:
        axes = torch.zeros(half, dtype=torch.int64)
        for axis in (1, 2):
            axes[axis:section[axis] * 3:3] = axis
    else:
        axes = torch.repeat_interleave(torch.arange(3), torch.tensor(section))
    return torch.cat((axes, axes))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fused: bool = True) -> torch.Tensor:
    """x: [T, H, D]; cos/sin: [T, D]. Where fused (CPU, `fused`), x is rotated in place and returned."""
    op = fused_op(x) if fused else None
    if op is not None and x.stride(-1) == 1:
        op.rotary_(x, cos, sin)
        return x
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: TextConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.qkv_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        self.sm_scale = cfg.head_dim ** -0.5
        self.fused_ops = True  # KernelConfig.fused_ops: rotary and the KV store fused
        if cfg.qk_norm:  # Qwen3: each head of q and k normalised before the rotary
            self.q_norm, self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps), RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def fuse(self) -> None:
        """One GEMM for q, k and v (after loading the checkpoint's separate weights)."""
        self.qkv_proj = _fused_linear(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x, cos, sin, batch: ForwardBatch, kv: KVPool, attn: AttentionBackend):
        """x: [T, hidden], or QuantizedRows for a W8A8 qkv_proj."""
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        modules = self._modules  # submodules read from their dict: nn.Module's __getattr__ costs ~0.3 us a name
        qkv_proj = modules.get("qkv_proj")
        if qkv_proj is not None:
            qkv = qkv_proj(x)
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        else:
            qkv, (q, k, v) = None, (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        t = q.shape[0]
        q, k = q.view(t, self.num_heads, self.head_dim), k.view(t, self.num_kv_heads, self.head_dim)
        if "q_norm" in modules:  # new tensors: the in-place rotary below no longer reaches the qkv rows
            q, k, qkv = modules["q_norm"](q), modules["k_norm"](k), None
        # q and k sit side by side in each row of the fused output: one rotary call for both, in place
        # (q and k above are views of it, so they see the rotation)
        qk = (None if qkv is None
              else qkv[:, :q_size + kv_size].view(t, self.num_heads + self.num_kv_heads, self.head_dim))
        fused = self.fused_ops
        if qk is not None and fused and fused_op(qk) is not None:
            apply_rotary(qk, cos, sin)
        else:
            q, k = apply_rotary(q, cos, sin, fused), apply_rotary(k, cos, sin, fused)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        kv.write(self.layer_id, batch.out_cache_loc, k, v, fused=fused)
        o = attn.forward(q, kv.k_buffers[self.layer_id], kv.v_buffers[self.layer_id], batch, self.sm_scale)
        return modules["o_proj"](o.reshape(t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.fused_ops = True  # KernelConfig.fused_ops: SiLU*mul fused

    def fuse(self) -> None:
        """One GEMM for gate and up."""
        self.gate_up_proj = _fused_linear(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj

    def forward(self, x):
        modules = self._modules  # (as Attention.forward)
        gate_up_proj, down_proj = modules.get("gate_up_proj"), modules["down_proj"]
        if gate_up_proj is not None:
            gate_up = gate_up_proj(x)
            op = fused_op(gate_up) if self.fused_ops else None
            if op is not None and isinstance(down_proj, Int8Linear) and down_proj.reads_quantized_rows():
                q, scale = op.silu_mul_quant(gate_up)  # quantized for the W8A8 down_proj in the same pass
                return down_proj(QuantizedRows(q, scale, gate_up.dtype))
            if op is not None:
                return down_proj(op.silu_mul(gate_up))
            gate, up = gate_up.chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return down_proj(nn.functional.silu(gate) * up)


def _fused_linear(*parts: nn.Linear) -> nn.Linear:
    if any(isinstance(p, QuantizedLinear) for p in parts):
        return fuse_quantized(list(parts))
    w = parts[0].weight
    fused = nn.Linear(w.shape[1], sum(p.out_features for p in parts), bias=parts[0].bias is not None,
                      device=w.device, dtype=w.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in parts]))
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([p.bias for p in parts]))
    return fused


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TextConfig, layer_id: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_id)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, residual, cos, sin, batch, kv, attn):
        """(x, residual) -> (this layer's MLP output, the residual stream before it): the stream's
        next addition is left to whoever normalises it next (the next layer's input norm, or the
        final norm), so each add and the norm after it are one fused pass. residual None: x is the
        stream itself (the first layer)."""
        modules = self._modules  # (as Attention.forward)
        self_attn, mlp = modules["self_attn"], modules["mlp"]
        attn_in = self_attn._modules.get("qkv_proj")
        if residual is None:
            residual, h = _norm(modules["input_layernorm"], x, None, attn_in)
        else:
            residual, h = _norm(modules["input_layernorm"], residual, x, attn_in)
        attn_out = self_attn(h, cos, sin, batch, kv, attn)
        residual, h = _norm(modules["post_attention_layernorm"], residual, attn_out, mlp._modules.get("gate_up_proj"))
        return mlp(h), residual


def _norm(norm: RMSNorm, x: torch.Tensor, a: torch.Tensor | None, reader: nn.Module | None):
    """(x + a, norm(x + a)), or (x, norm(x)) where a is None. Where `reader`, the projection the norm's
    output goes to, is a W8A8 layer on its kernel, the output comes as its int8 rows (QuantizedRows):
    quantized once, in the norm's pass."""
    if isinstance(reader, Int8Linear) and reader.reads_quantized_rows():
        done = norm.quantized(x, a)
        if done is not None:
            return done
    return (x, norm(x)) if a is None else norm.add_and_norm(x, a)


class LlamaDecoder(nn.Module):
    """embed_tokens → layers → norm; the lm_head lives on the LLaVA wrapper (it may be tied)."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.hf_config, cfg.head_dim, cfg.mrope_section, cfg.mrope_interleaved)

    def fuse_projections(self) -> None:
        for layer in self.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def use_fused_ops(self, enabled: bool) -> None:
        """KernelConfig.fused_ops: every norm, attention and MLP takes the fused kernels or eager PyTorch."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, MLP)):
                module.fused_ops = enabled

    def forward(self, hidden: torch.Tensor, batch: ForwardBatch, kv: KVPool, attn: AttentionBackend,
                deepstack: torch.Tensor | None = None):
        """deepstack (Qwen3-VL): [levels, image rows, hidden], added after layer i at batch.image_mask's
        rows for each level i."""
        seq_lens = None
        if self.rotary.long_after is not None:
            seq_lens = torch.repeat_interleave(batch.seq_lens, batch.extend_lens, output_size=hidden.shape[0])
        cos, sin = self.rotary(batch.positions, hidden.dtype, seq_lens)
        residual = None
        for i, layer in enumerate(self.layers):
            hidden, residual = layer(hidden, residual, cos, sin, batch, kv, attn)
            if deepstack is not None and i < deepstack.shape[0]:  # the stream is residual + hidden
                hidden[batch.image_mask] += deepstack[i]
        return self.norm(hidden) if residual is None else self.norm.add_and_norm(residual, hidden)[1]


def logits_hidden(hidden: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    """The rows of the final hidden states whose logits the batch wants (batch.logits_rows). The rows
    ascend, one at most per token, so as many as there are tokens (every decode batch) is all of them:
    no gather then."""
    rows = batch.logits_rows
    return hidden if rows.shape[0] == hidden.shape[0] else hidden.index_select(0, rows)
