"""Runs a workload on vLLM offline; executed by vLLM's own Python (it must not import vlserve).

    VENV/bin/python vllm_offline.py spec.json out.json

spec: {"model", "threads", "dtype", "requests": [{"prompt", "images": [png paths], "max_new_tokens"}]}.
out: wall time of one LLM.generate over every request (after a warm-up), per-request token counts,
num_cached_tokens (prefix-cache hits), and latency / time to first token where vLLM reports them.
"""

import json
import sys
import time


def main(spec_path: str, out_path: str) -> None:
    import vllm
    from PIL import Image
    from vllm import LLM, SamplingParams

    spec = json.load(open(spec_path))
    reqs = spec["requests"]
    max_images = max(1, max(len(r["images"]) for r in reqs))
    llm = LLM(model=spec["model"], enforce_eager=True, enable_prefix_caching=True, dtype=spec.get("dtype", "float32"),
              max_model_len=4096, limit_mm_per_prompt={"image": max_images}, seed=0)
    inputs = []
    for r in reqs:
        item = {"prompt": r["prompt"]}
        if r["images"]:
            images = [Image.open(p).convert("RGB") for p in r["images"]]
            item["multi_modal_data"] = {"image": images if len(images) > 1 else images[0]}
        inputs.append(item)
    params = [SamplingParams(temperature=0.0, max_tokens=r["max_new_tokens"], ignore_eos=True) for r in reqs]
    warm = {"prompt": "USER: warm up " + "x " * 8 + "ASSISTANT:"}
    llm.generate([warm], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    start = time.time()
    outs = llm.generate(inputs, params, use_tqdm=False)
    wall = time.time() - start
    latency, ttft = [], []
    for o in outs:
        m = getattr(o, "metrics", None)
        first, last = getattr(m, "first_token_ts", None), getattr(m, "last_token_ts", None)
        if first and last and getattr(m, "arrival_time", None):
            ttft.append(first - m.arrival_time)
            latency.append(last - m.arrival_time)
    result = {"version": vllm.__version__, "wall_s": wall, "block_size": _block_size(llm),
              "prompt_tokens": [len(o.prompt_token_ids) for o in outs],
              "completion_tokens": [len(o.outputs[0].token_ids) for o in outs],
              "cached_tokens": [o.num_cached_tokens or 0 for o in outs],
              "texts": [o.outputs[0].text for o in outs],
              "latency_s": latency if len(latency) == len(outs) else [wall] * len(outs),
              "ttft_s": ttft if len(ttft) == len(outs) else []}
    json.dump(result, open(out_path, "w"))


def _block_size(llm):
    engine = llm.llm_engine
    config = getattr(engine, "vllm_config", None) or getattr(engine, "cache_config", None)
    cache = getattr(config, "cache_config", config)
    return getattr(cache, "block_size", None)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
