"""Engine options: one dataclass, one default and one choice list for each.

`Engine(**kwargs)` takes these fields; `vlserve serve` takes them as flags (field name with dashes)
plus the server's own options (vlserve/server/args.py: host, port, api key, HTTP limits). Each
part of the engine gets a sub-config built by keyword from the same fields (`pick`), so no default
is written twice.
"""

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass, field

from vlserve.core.model_id import hub_model_id

SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs", "random")
ATTENTION_BACKENDS = ("torch", "triton", "reference")  # reference: the per-request PyTorch loop, for comparisons
DTYPES = ("auto", "float32", "float16", "bfloat16")
METRICS_NAMES = ("vlserve", "vllm", "sglang")
BUILTIN_MODEL_NAME = "vlserve-builtin"


def _opt(default, help: str | None = None, choices=None, nargs: str | None = None):
    return field(default=default, metadata={"help": help, "choices": choices, "nargs": nargs})


class CLIArgs:
    """Flags from dataclass fields: `--field-name`, typed from the annotation, help from metadata."""

    ALIASES: dict[str, list[str]] = {}

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(cls):
            flags = ["--" + f.name.replace("_", "-")] + cls.ALIASES.get(f.name, [])
            kwargs = {"dest": f.name, "default": f.default, "help": f.metadata.get("help")}
            if f.type is bool or f.type == "bool":
                parser.add_argument(*flags, action="store_true", **kwargs)
                continue
            kind = int if "int" in str(f.type) else float if "float" in str(f.type) else str
            if f.metadata.get("nargs"):
                kwargs["nargs"] = f.metadata["nargs"]
            parser.add_argument(*flags, type=kind, choices=f.metadata.get("choices"), **kwargs)

    @classmethod
    def from_cli(cls, ns: argparse.Namespace):
        return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})


MIXED_PREFILL_RATIO_HELP = ("while requests decode, a step's prefill is sized (from measured step times) to take about "
                            "this many decode steps, so a long prompt or video does not stall the streams (0 = off: "
                            "--chunked-prefill-size alone bounds it; default: 1 for `serve`, 0 offline)")


@dataclass
class EngineArgs(CLIArgs):
    model: str | None = _opt(None, "a local Hugging Face LLaVA directory, or a model id (org/name) fetched through "
                                   "the Hugging Face cache (HF_HOME, HF_HUB_OFFLINE); default: the built-in model")
    revision: str | None = _opt(None, "the branch, tag or commit of a --model-path given as a model id (default: main)")
    served_model_name: str | None = _opt(None, "the model name(s) clients may send, comma-separated; the first is "
                                               "the one answers and metrics carry (default: the model id, or the "
                                               "model directory's name)")
    schedule_policy: str = _opt("lpm", choices=SCHEDULE_POLICIES)
    disable_radix_cache: bool = False
    attention_backend: str | None = _opt(None, "default: triton with CUDA, else torch (the batched CPU kernel)",
                                         ATTENTION_BACKENDS)
    max_total_tokens: int | None = _opt(None, "KV pool size in tokens (default: what --mem-fraction-static "
                                              "leaves after the weights)")
    mem_fraction_static: float = _opt(0.3, "share of the memory the engine can use (a GPU's total; on the host, "
                                           "what was available at start) for the weights and the KV pool together, "
                                           "as SGLang's flag; the pool gets what the loaded weights leave of it "
                                           "when --max-total-tokens is not given")
    page_size: int = 1
    tp_size: int = _opt(1, "tensor parallelism: N processes, each holding 1/N of the decoder (gloo on the CPU, "
                           "NCCL on GPUs)")
    dist_init_addr: str | None = _opt(None, "HOST:PORT where the tensor-parallel ranks meet (node 0's address; "
                                            "default: MASTER_ADDR:MASTER_PORT, else a free local port)")
    nnodes: int = _opt(1, "machines the tensor-parallel ranks span (tp_size / nnodes ranks on each)")
    node_rank: int = _opt(0, "this machine's index among --nnodes; node 0 serves, the others only run ranks")
    chunked_prefill_size: int = 2048
    max_num_encoder_input_tokens: int | None = _opt(None, "vision tokens (image and frame placeholders) whose "
                                                          "tower work one step may start; a long video is encoded "
                                                          "over several steps (default: no cap beyond "
                                                          "--chunked-prefill-size)")
    # 0 (off) for the offline Engine, a throughput job with no one watching its streams; `vlserve serve`
    # defaults to 1 (ServerArgs), as vLLM sizes its step budget by usage context (offline LLM vs server)
    mixed_prefill_ratio: float = _opt(0.0, MIXED_PREFILL_RATIO_HELP)
    max_running_requests: int = 128
    max_waiting_requests: int = _opt(1024, "waiting-queue length past which requests get 503")
    context_length: int | None = None
    dtype: str = _opt("auto", choices=DTYPES)
    chat_template: str | None = _opt(None, "a Jinja chat template file to use instead of the checkpoint's")
    device: str | None = None
    vision_cache_mb: float = 256.0
    video_frames: int | None = _opt(None, "frames sampled per video (default: 8)")
    video_max_frames: int = _opt(64, "frames one video may be sampled to (a request asking for more gets a 400)")
    allowed_media_path: str | None = _opt(None, "directory local media paths may be read from")
    allow_url_fetch: bool = _opt(False, "let requests name http(s) media URLs (public addresses only)")
    allowed_media_domains: str | None = _opt(None, "comma-separated URL hosts fetched even when they resolve to "
                                                   "loopback or private addresses")
    max_images_per_request: int = 16
    new_token_ratio: float = 0.4
    prefix_share_threshold: int = _opt(4, "in-batch prefix sharing: a request sharing this many uncached tokens "
                                          "with one admitted this round reuses its KV in the same forward, or "
                                          "waits a round where it cannot (0 = off)")
    max_wait_steps: int = _opt(512, "aging: a request waiting this many steps goes first")
    disable_jump_forward: bool = False
    grammar_compile_timeout: float = _opt(10.0, "seconds a regex / JSON schema may take to compile (in a worker "
                                                "process); past it the request gets a 400: too large or too open")
    grammar_max_states: int = _opt(20_000, "automaton states a regex / JSON schema may compile to; past it the "
                                          "request gets a 400: too large or too open")
    grammar_compile_workers: int = _opt(2, "worker processes compiling regexes and JSON schemas")
    request_timeout: float | None = _opt(None, "seconds a request may wait and run; past it, it ends with an error "
                                               "(HTTP 504) and frees its KV (default: no limit)")
    num_threads: int | None = _opt(None, "torch CPU threads")
    metrics_names: str = _opt("vlserve", "also export metrics under vLLM's or SGLang's names, for their "
                                         "Grafana dashboards", METRICS_NAMES)
    log_requests: bool = _opt(False, "log every request's arrival and its end (ids, tokens, latency)")
    log_stats_interval: float = _opt(10.0, "seconds between the engine's throughput log lines while busy (0 = off)")
    disable_cpu_gemm: bool = _opt(False, "CPU: plain F.linear (MKL) for every linear layer instead of the measured "
                                         "GEMM paths (oneDNN, packed weights, the decode and small-row kernels)")
    disable_small_gemm: bool = _opt(False, "CPU: no small-row GEMM kernel; those rows go to oneDNN / MKL")
    disable_fused_ops: bool = _opt(False, "CPU: the decoder's norms, rotary, SiLU*mul and KV stores as eager "
                                          "PyTorch instead of the fused kernels")

    # SGLang's and vLLM's names for the same options
    ALIASES = {"model": ["--model-path"], "tp_size": ["--tp", "--tensor-parallel-size"],
               "max_waiting_requests": ["--max-queued-requests"]}

    def __post_init__(self):
        if self.tp_size < 1 or self.nnodes < 1 or self.tp_size % self.nnodes:
            raise ValueError(f"--tp-size {self.tp_size} must be >= 1 and a multiple of --nnodes {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be in [0, --nnodes), got {self.node_rank}")
        if self.page_size < 1:
            raise ValueError(f"--page-size must be >= 1, got {self.page_size}")
        if self.chunked_prefill_size < 1:
            raise ValueError(f"--chunked-prefill-size must be >= 1, got {self.chunked_prefill_size}")
        if self.max_num_encoder_input_tokens is not None and self.max_num_encoder_input_tokens < 1:
            raise ValueError(f"--max-num-encoder-input-tokens must be >= 1, got {self.max_num_encoder_input_tokens}")
        if not (self.mixed_prefill_ratio >= 0 and math.isfinite(self.mixed_prefill_ratio)):
            raise ValueError(f"--mixed-prefill-ratio must be >= 0, got {self.mixed_prefill_ratio}")
        if self.video_max_frames < 1:
            raise ValueError(f"--video-max-frames must be >= 1, got {self.video_max_frames}")
        if self.max_total_tokens is not None and self.max_total_tokens < self.page_size:
            raise ValueError(f"--max-total-tokens must be >= page size, got {self.max_total_tokens}")
        if not 0 < self.mem_fraction_static < 1:
            raise ValueError(f"--mem-fraction-static must be in (0, 1), got {self.mem_fraction_static}")
        if not (self.grammar_compile_timeout > 0 and self.grammar_max_states >= 1
                and self.grammar_compile_workers >= 1):
            raise ValueError("--grammar-compile-timeout must be > 0, --grammar-max-states and "
                             "--grammar-compile-workers >= 1")

    def model_names(self) -> list[str]:
        if self.served_model_name:
            return [n.strip() for n in self.served_model_name.split(",") if n.strip()]
        if not self.model:
            return [BUILTIN_MODEL_NAME]
        return [hub_model_id(self.model) or os.path.basename(os.path.normpath(self.model))]

    def model_name(self) -> str:
        return self.model_names()[0]

    def engine_kwargs(self) -> dict:
        """The EngineArgs fields of this object (a subclass adds server-only fields)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(EngineArgs)}


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    schedule_policy: str
    disable_radix_cache: bool
    chunked_prefill_size: int
    max_num_encoder_input_tokens: int | None = None  # None: no cap beyond chunked_prefill_size
    mixed_prefill_ratio: float = 0.0  # 0: a step beside decodes prefills up to chunked_prefill_size
    max_running_requests: int
    new_token_ratio: float
    max_wait_steps: int
    prefix_share_threshold: int
    disable_jump_forward: bool
    log_requests: bool
    request_timeout: float | None


@dataclass(frozen=True, kw_only=True)
class KernelConfig:
    """Which kernel paths the model is built with; all on by default. Each off switch takes the
    path's documented fallback (same results), for comparisons and for tests of either side."""
    cpu_gemm: bool = True  # CpuLinear on the CPU; off: nn.Linear (F.linear)
    small_gemm: bool = True  # CpuLinear's small-row kernel; off: those rows go to oneDNN / MKL
    fused_ops: bool = True  # fused norms, rotary, SiLU*mul and KV stores; off: eager PyTorch

    @classmethod
    def from_args(cls, args: "EngineArgs") -> "KernelConfig":
        return cls(cpu_gemm=not args.disable_cpu_gemm, small_gemm=not args.disable_small_gemm,
                   fused_ops=not args.disable_fused_ops)


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    max_total_tokens: int  # resolved: from the flag or from available memory
    page_size: int
    max_running_requests: int
    context_length: int  # resolved: the flag capped by the model's max positions


def pick(config_cls, args: EngineArgs, **resolved):
    """Builds a sub-config by keyword from args' same-named fields; `resolved` overrides some."""
    names = [f.name for f in dataclasses.fields(config_cls)]
    return config_cls(**{n: resolved[n] if n in resolved else getattr(args, n) for n in names})
