"""The frontend language measured against a vlserve server (the built-in model):

1. co-design: the tree-of-thought and essay-judge programs (examples/) over run_batch with the fork
   and run_batch hints on vs off, each from a fresh server — programs/s and radix-cache hit rate
   (cached / prompt tokens, from /metrics) — also with the scheduler's in-batch prefix sharing off;
2. the same programs written against the plain openai client (benchmarks/frontend_openai.py):
   lines of code and wall time;
3. API speculative execution on vlserve's /v1/completions: calls and billed prompt tokens.

    python benchmarks/frontend.py [--items 8] [--spec builtin|bench] [--out benchmarks/results]
"""

import argparse
import inspect
import io
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "examples")]

import essay_judge  # noqa: E402
import frontend_openai  # noqa: E402
import tree_of_thought  # noqa: E402
from common import scene  # noqa: E402

import vlserve.lang as sgl  # noqa: E402
from vlserve.server.app import make_engine  # noqa: E402
from vlserve.server.background import BackgroundServer  # noqa: E402
from vlserve.server.args import ServerArgs  # noqa: E402


MODEL: str | None = None  # None: the built-in model (--spec bench: the 104.7 M benchmark model)


def start_server(**overrides):
    args = ServerArgs(model=MODEL, port=0, max_total_tokens=16384, num_threads=2, **overrides)
    engine = make_engine(args)
    return engine, BackgroundServer(engine, args).start()


def counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    wanted = ("vlserve_prompt_tokens_total", "vlserve_cached_prompt_tokens_total",
              "vlserve_vision_encoder_images_total")
    found = {}
    for line in text.splitlines():
        name = line.split(" ")[0].split("{")[0]  # every series carries a model_name label
        if name in wanted:
            found[name] = found.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def tot_batch(n: int) -> list[dict]:
    return [{"picture": p, "question": qas[0].question} for p, qas in map(scene, range(40, 40 + n))]


def essay_batch(n: int) -> list[dict]:
    out, seed = [], 59
    while len(out) < n:  # scenes whose questions cover every dimension (not every scene asks them all)
        seed += 1
        picture, qas = scene(seed)
        by_type = {}
        for qa in qas:
            by_type.setdefault(qa.qtype, qa)  # the first question of each type
        if not all(d in by_type for d in ("caption", *essay_judge.DIMENSIONS)):
            continue
        caption = by_type["caption"].answer
        questions = [by_type[d].question for d in essay_judge.DIMENSIONS]
        out.append({"picture": picture, "essay": caption if seed % 2 == 0 else "A blue square on a white background.",
                    "questions": questions})
    return out


PROGRAMS = {"tree_of_thought": (tree_of_thought.tree_of_thought, frontend_openai.tree_of_thought, tot_batch, {}),
            "essay_judge": (essay_judge.essay_judge, frontend_openai.essay_judge, essay_batch, {"temperature": 0})}


def measure(run, url: str) -> dict:
    before = counters(url)
    start = time.perf_counter()
    n = run()
    wall = time.perf_counter() - start
    after = counters(url)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    prompt, cached = delta["vlserve_prompt_tokens_total"], delta["vlserve_cached_prompt_tokens_total"]
    return {"programs": n, "wall_s": round(wall, 2), "programs_per_s": round(n / wall, 2),
            "prompt_tokens": int(prompt), "cached_tokens": int(cached), "hit_rate": round(cached / prompt, 3),
            "vision_tower_images": int(delta["vlserve_vision_encoder_images_total"])}


def run_lang(program, batch, kwargs, hints: bool):
    def run():
        sgl.global_config.enable_fork_hint = sgl.global_config.enable_precache_with_tracing = hints
        try:
            states = program.run_batch(batch, backend=sgl.RuntimeEndpoint(url_of_run), **kwargs)
            assert all(s.error() is None for s in states), [s.error() for s in states]
        finally:
            sgl.global_config.enable_fork_hint = sgl.global_config.enable_precache_with_tracing = True
        return len(states)
    return run


def run_openai(function, batch):
    import openai

    client = openai.OpenAI(base_url=url_of_run + "/v1", api_key="unused")
    model = client.models.list().data[0].id  # the served name: vlserve-builtin, or the benchmark model's

    def run():
        with ThreadPoolExecutor(64) as pool:
            list(pool.map(lambda kw: function(client, model, **kw), batch))
        return len(batch)
    return run


url_of_run = ""


def fresh(run_factory, **server_overrides) -> dict:
    """Each configuration on its own fresh server (empty cache), after one warm-up request."""
    global url_of_run
    engine, server = start_server(**server_overrides)
    url_of_run = server.url
    try:
        httpx.post(server.url + "/generate", json={"text": "warm up", "sampling_params": {"max_new_tokens": 1}},
                   timeout=60)
        return measure(run_factory(), server.url)
    finally:
        server.stop()
        engine.shutdown()


def code_lines(function) -> int:
    """Lines of a function's code: no blank lines, comments or docstring."""
    source = inspect.getsource(function)
    doc = inspect.getdoc(function)
    lines = [ln.strip() for ln in source.splitlines()]
    count = sum(1 for ln in lines if ln and not ln.startswith("#") and not ln.startswith("@"))
    return count - (len(doc.splitlines()) if doc else 0)


def baseline_lines(function) -> int:
    helpers = [frontend_openai.chat, frontend_openai.image_turn, frontend_openai.yes_or_no]
    return code_lines(function) + sum(code_lines(h) for h in helpers)


def speculation() -> dict:
    """Always on the built-in model: speculation pays only on a model that writes the template's words."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    args = ServerArgs(port=0, max_total_tokens=16384, num_threads=2)
    engine = make_engine(args)
    server = BackgroundServer(engine, args).start()
    try:
        from test_lang_openai_vlserve import caption_fields
        out = {}
        for label, spec in (("without", None), ("with", 32)):
            backend = sgl.OpenAI("vlserve-builtin", is_chat_model=False, base_url=server.url + "/v1",
                                 api_key="unused", chat_template=sgl.get_chat_template("vicuna_v1.1"))
            state = sgl.function(num_api_spec_tokens=spec)(caption_fields).run(temperature=0, backend=backend)
            out[label] = {"calls": backend.token_usage.calls, "prompt_tokens": backend.token_usage.prompt_tokens,
                          "variables": {k: state[k] for k in ("first", "second")}}
        out["billed_prompt_ratio"] = round(out["without"]["prompt_tokens"] / out["with"]["prompt_tokens"], 2)
        return out
    finally:
        server.stop()
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--spec", choices=("builtin", "bench"), default="builtin")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    global MODEL
    if args.spec == "bench":
        from vlserve.bench.models import bench_model

        MODEL = bench_model("/tmp/vlserve-bench-models/bench")
    results = {}
    for name, (program, baseline, make_batch, kwargs) in PROGRAMS.items():
        batch = make_batch(args.items)
        results[name] = {
            "hints_on": fresh(lambda: run_lang(program, batch, kwargs, hints=True)),
            "hints_off": fresh(lambda: run_lang(program, batch, kwargs, hints=False)),
            "plain_openai": fresh(lambda: run_openai(baseline, batch)),
            # the scheduler's in-batch prefix sharing off: what the hints are left to do alone
            "hints_on_no_inbatch_sharing": fresh(lambda: run_lang(program, batch, kwargs, hints=True),
                                                 prefix_share_threshold=0),
            "hints_off_no_inbatch_sharing": fresh(lambda: run_lang(program, batch, kwargs, hints=False),
                                                  prefix_share_threshold=0),
            "lines": {"vlserve.lang": code_lines(program.func), "plain_openai": baseline_lines(baseline)},
        }
        print(name, json.dumps(results[name]), flush=True)
    results["speculation"] = speculation()
    print("speculation", json.dumps(results["speculation"]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"frontend_{args.spec}.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, f"frontend_{args.spec}.md"), "w") as f:
        f.write(table(results))
    print(table(results))


def table(results: dict) -> str:
    buf = io.StringIO()
    buf.write("| program | run | programs/s | wall s | prompt tokens | cached | computed | hit rate "
              "| vision-tower images | lines |\n")
    buf.write("|---|---|---|---|---|---|---|---|---|---|\n")
    for name in PROGRAMS:
        r = results[name]
        for run in ("hints_on", "hints_off", "plain_openai", "hints_on_no_inbatch_sharing",
                    "hints_off_no_inbatch_sharing"):
            if run not in r:
                continue
            m = r[run]
            lines = r["lines"]["plain_openai" if run == "plain_openai" else "vlserve.lang"]
            buf.write(f"| {name} | {run} | {m['programs_per_s']} | {m['wall_s']} | {m['prompt_tokens']} | "
                      f"{m['cached_tokens']} | {m['prompt_tokens'] - m['cached_tokens']} | {m['hit_rate']:.1%} | "
                      f"{m['vision_tower_images']} | {lines} |\n")
    s = results["speculation"]
    buf.write(f"\nSpeculative execution on /v1/completions: {s['without']['calls']} calls / "
              f"{s['without']['prompt_tokens']} billed prompt tokens without, {s['with']['calls']} / "
              f"{s['with']['prompt_tokens']} with ({s['billed_prompt_ratio']}x fewer); same variables: "
              f"{s['with']['variables'] == s['without']['variables']}\n")
    return buf.getvalue()


if __name__ == "__main__":
    main()
