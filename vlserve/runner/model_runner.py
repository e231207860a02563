"""Owns the model and runs one step's plan on it: `result = runner.run(plan)`."""

import torch

from vlserve.cache.vision_cache import VisionEmbeddingCache
from vlserve.core.forward_batch import ForwardBatch, ForwardMode, build_forward_batch
from vlserve.core.step import PlannedExtend, StepResult
from vlserve.core.config import MemoryConfig
from vlserve.memory.pools import KVMemory, KVShape
from vlserve.metrics import Metrics
from vlserve.model.attention import AttentionBackend
from vlserve.model.loader import LoadedModel
from vlserve.runner.extend_slices import extend_slice, prompt_logprobs
from vlserve.runner.image_embedder import ImageEmbedder
from vlserve.runner.sample_step import sample_requests
from vlserve.sampling.sampler import sample

# Prometheus label of a forward pass (an interface: forward_passes_total{mode="prefill|decode"})
_MODE_LABEL = {ForwardMode.EXTEND: "prefill", ForwardMode.DECODE: "decode"}


class ModelRunner:
    def __init__(self, loaded: LoadedModel, memory: KVMemory, attention_backend: str, metrics: Metrics,
                 vision_cache_mb: float, device: str = "cpu", eos_token_ids: tuple[int, ...] = ()):
        self.loaded, self.model, self.memory, self.device = loaded, loaded.model, memory, device
        self.eos_token_ids = eos_token_ids
        self.sampler = sample  # the token sampler after the masks; a test may give its own
        self.vocab_size = loaded.config.text.vocab_size
        self.attention = AttentionBackend(attention_backend)
        self.metrics = metrics
        self.embedder = ImageEmbedder(self.encode_images, VisionEmbeddingCache(vision_cache_mb), metrics)

    @classmethod
    def standalone(cls, loaded: LoadedModel, max_total_tokens: int, page_size: int = 1, max_running_requests: int = 8,
                   context_length: int = 256, attention_backend: str = "torch") -> "ModelRunner":
        """A runner with memory and metrics of its own, to drive the model without a scheduler (tests that
        compare it with transformers, per-token benchmarks). Rows and slots: runner.memory."""
        t = loaded.config.text
        memory = KVMemory.create(KVShape(t.num_layers, t.num_kv_heads, t.head_dim, loaded.config.dtype),
                                 MemoryConfig(max_total_tokens=max_total_tokens, page_size=page_size,
                                              max_running_requests=max_running_requests, context_length=context_length),
                                 next(loaded.model.parameters()).device)
        return cls(loaded, memory, attention_backend, Metrics(), vision_cache_mb=0)

    def run(self, plan: list[PlannedExtend]) -> StepResult:
        embeds = self.embedder.prepare([(p.req, p.req.kv_len, p.req.kv_len + p.num_tokens)
                                        for p in plan if p.req.images])
        slices = [extend_slice(p, embeds) for p in plan]
        batch = build_forward_batch(slices, self.memory.req_to_token.table, self.vocab_size, self.device)
        logits = self.forward(batch)
        self.metrics.forward_passes.labels(mode=_MODE_LABEL[batch.mode]).inc()
        layout = batch.layout
        input_logprobs = [prompt_logprobs(p.req, s, logits[layout.rows(i)]) if s.logits_from != -1 else []
                          for i, (p, s) in enumerate(zip(plan, slices))]
        chosen = [i for i, p in enumerate(plan) if p.sample]
        sampled, errors = [None] * len(plan), [None] * len(plan)
        if chosen:
            tokens, failures = sample_requests(logits[[layout.last(i) for i in chosen]], [plan[i].req for i in chosen],
                                               self.eos_token_ids, self.sampler)
            for i, tok, err in zip(chosen, tokens, failures):
                sampled[i], errors[i] = tok, err
        return StepResult(plan, batch.mode, sampled, errors, input_logprobs)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.model(batch, self.memory.kv, self.attention)

    def encode_images(self, pixel_values: list[torch.Tensor], image_sizes: list | None = None,
                      roles: list[str] | None = None) -> list[torch.Tensor]:
        """Per image its embeddings; image_sizes (original (height, width)) and roles (image or video
        frame) matter only to anyres models."""
        sizes = image_sizes or [None] * len(pixel_values)
        return self.model.encode_images([p.to(self.device) for p in pixel_values], sizes, roles)
