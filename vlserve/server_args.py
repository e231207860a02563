"""Every option of `vlserve serve` and `Engine(**kwargs)`: one dataclass, flags = fields with dashes."""

import argparse
import dataclasses
from dataclasses import dataclass, field


@dataclass
class ServerArgs:
    model: str | None = field(default=None, metadata={"help": "local Hugging Face LLaVA directory (default: the built-in model)"})
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = field(default=None, metadata={"help": "require 'Authorization: Bearer KEY'"})
    schedule_policy: str = field(default="lpm", metadata={"choices": ["lpm", "dfs-weight", "fcfs", "random"]})
    disable_radix_cache: bool = False
    attention_backend: str | None = field(default=None, metadata={"choices": ["torch", "triton"], "help": "default: triton with CUDA, else torch"})
    max_total_tokens: int | None = field(default=None, metadata={"help": "KV pool size in tokens (default: from available memory)"})
    page_size: int = 1
    tp_size: int = field(default=1, metadata={"help": "tensor parallelism (only 1 is supported)"})
    chunked_prefill_size: int = 2048
    max_running_requests: int = 128
    max_waiting_requests: int = 1024
    context_length: int | None = None
    dtype: str = field(default="auto", metadata={"choices": ["auto", "float32", "float16", "bfloat16"]})
    device: str | None = None
    vision_cache_mb: float = 256.0
    video_frames: int | None = field(default=None, metadata={"help": "frames sampled per video (default: 8)"})
    allowed_media_path: str | None = field(default=None, metadata={"help": "directory local media paths may be read from"})
    allow_url_fetch: bool = field(default=False, metadata={"help": "let requests name http(s) media URLs"})
    max_request_bytes: int = 64 * 1024 * 1024
    max_images_per_request: int = 16
    new_token_ratio: float = 0.4
    prefix_share_threshold: int = field(default=4, metadata={"help": "in-batch prefix sharing: a request sharing this many uncached tokens with one admitted this round waits a round (0 = off)"})
    max_wait_steps: int = 512
    disable_jump_forward: bool = False
    num_threads: int | None = field(default=None, metadata={"help": "torch CPU threads"})
    log_level: str = "info"

    def __post_init__(self):
        if self.tp_size != 1:
            raise ValueError(f"--tp {self.tp_size}: only tp_size 1 is supported in this release")
        if self.page_size < 1:
            raise ValueError(f"--page-size must be >= 1, got {self.page_size}")
        if self.chunked_prefill_size < 1:
            raise ValueError(f"--chunked-prefill-size must be >= 1, got {self.chunked_prefill_size}")
        if self.max_total_tokens is not None and self.max_total_tokens < self.page_size:
            raise ValueError(f"--max-total-tokens must be >= page size, got {self.max_total_tokens}")

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        aliases = {"tp_size": ["--tp"]}
        for f in dataclasses.fields(cls):
            flags = ["--" + f.name.replace("_", "-")] + aliases.get(f.name, [])
            kwargs = {"dest": f.name, "default": f.default, "help": f.metadata.get("help")}
            if f.type is bool or f.type == "bool":
                parser.add_argument(*flags, action="store_true", **kwargs)
                continue
            kind = int if "int" in str(f.type) else float if "float" in str(f.type) else str
            parser.add_argument(*flags, type=kind, choices=f.metadata.get("choices"), **kwargs)

    @classmethod
    def from_cli(cls, ns: argparse.Namespace) -> "ServerArgs":
        return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})
