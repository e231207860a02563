"""Runs a workload on vLLM offline; executed by vLLM's own Python (it must not import vlserve).

    VENV/bin/python vllm_offline.py spec.json out.json

spec: {"model", "threads", "dtype", "max_num_batched_tokens" (or null: vLLM's default),
       "batches" (timed batches, default 1), "enforce_eager" (default false: vLLM's compiled mode),
       "kv_cache_memory_bytes" (or null: vLLM's default sizing),
       "requests": [{"prompt", "images": [png paths], "max_new_tokens",
                     "videos" (optional): [{"frames": .npy path of [T, H, W, 3] uint8, "metadata": {...}}]}]}.
       A video's metadata is vLLM's (fps, duration, total_num_frames, frames_indices): its frames are
       already sampled.
out: wall time of one LLM.generate over every request (after a warm-up), per-request token counts,
num_cached_tokens (prefix-cache hits), and latency / time to first token where vLLM reports them;
with several batches (the prefix, encoder and multimodal-input caches reset before each, the
warm-up's entries too, so each computes the same), those of the fastest, and every batch's wall time
in batch_walls_s.
"""

import json
import sys
import time


def main(spec_path: str, out_path: str) -> None:
    import numpy as np
    import vllm
    from PIL import Image
    from vllm import LLM, SamplingParams

    spec = json.load(open(spec_path))
    reqs = spec["requests"]
    max_images = max(1, max(len(r["images"]) for r in reqs))
    max_videos = max(len(r.get("videos", [])) for r in reqs)
    limits = {"image": max_images, **({"video": max_videos} if max_videos else {})}
    optional = {k: spec[k] for k in ("max_num_batched_tokens", "kv_cache_memory_bytes") if spec.get(k)}
    # compiled mode (the default) compiles while LLM() starts and on the warm-up below: neither is timed
    llm = LLM(model=spec["model"], enforce_eager=bool(spec.get("enforce_eager", False)), enable_prefix_caching=True,
              dtype=spec.get("dtype", "float32"), max_model_len=spec.get("max_model_len", 4096),
              limit_mm_per_prompt=limits, seed=0,
              disable_log_stats=False, **optional)  # with stats on, each output carries its timings
    inputs = []
    for r in reqs:
        item = {"prompt": r["prompt"]}
        if r["images"]:
            images = [Image.open(p).convert("RGB") for p in r["images"]]
            item["multi_modal_data"] = {"image": images if len(images) > 1 else images[0]}
        if r.get("videos"):
            videos = [(np.load(v["frames"]), {**v["metadata"], "do_sample_frames": False}) for v in r["videos"]]
            item.setdefault("multi_modal_data", {})["video"] = videos if len(videos) > 1 else videos[0]
        inputs.append(item)
    params = [SamplingParams(temperature=0.0, max_tokens=r["max_new_tokens"], ignore_eos=True) for r in reqs]
    warm = {"prompt": "USER: warm up " + "x " * 8 + "ASSISTANT:"}
    llm.generate([warm], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    walls, results = [], []
    for _ in range(spec.get("batches", 1)):
        _reset_caches(llm)  # the warm-up's or the previous batch's
        start = time.time()
        results.append(llm.generate(inputs, params, use_tqdm=False))
        walls.append(time.time() - start)
    best = min(range(len(walls)), key=walls.__getitem__)
    outs, wall = results[best], walls[best]
    latency, ttft = [], []
    for o in outs:
        # vLLM's RequestStateStats: arrival_time is wall-clock, the *_ts are the engine core's
        # monotonic clock, so latency is the first token's latency plus last_token_ts - first_token_ts.
        m = getattr(o, "metrics", None)
        first_latency = getattr(m, "first_token_latency", 0.0)
        first, last = getattr(m, "first_token_ts", 0.0), getattr(m, "last_token_ts", 0.0)
        if first_latency > 0 and first > 0 and last >= first:
            ttft.append(first_latency)
            latency.append(first_latency + (last - first))
    result = {"version": vllm.__version__, "wall_s": wall, "batch_walls_s": walls, "block_size": _block_size(llm),
              "compilation_mode": _compilation_mode(llm),
              "prompt_tokens": [len(o.prompt_token_ids) for o in outs],
              "completion_tokens": [len(o.outputs[0].token_ids) for o in outs],
              "cached_tokens": [o.num_cached_tokens or 0 for o in outs],
              "texts": [o.outputs[0].text for o in outs],
              "latency_s": latency if len(latency) == len(outs) else [wall] * len(outs),
              "ttft_s": ttft if len(ttft) == len(outs) else []}
    json.dump(result, open(out_path, "w"))


def _reset_caches(llm) -> None:
    """Empties what the previous batch left for the next one to reuse: cached prefix blocks, vision
    encoder outputs, processed multimodal inputs. A cache that cannot be reset fails the run (the next
    batch would reuse it and time less work)."""
    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset its prefix cache")
    llm.llm_engine.reset_encoder_cache()
    llm.reset_mm_cache()


def _compilation_mode(llm) -> str:
    config = getattr(llm.llm_engine, "vllm_config", None)
    mode = getattr(getattr(config, "compilation_config", None), "mode", None)
    return getattr(mode, "name", str(mode))


def _block_size(llm):
    engine = llm.llm_engine
    config = getattr(engine, "vllm_config", None) or getattr(engine, "cache_config", None)
    cache = getattr(config, "cache_config", config)
    return getattr(cache, "block_size", None)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
