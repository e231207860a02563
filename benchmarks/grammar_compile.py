"""Grammar compilation beside other requests, and the open schema's first compile.

    .venv/bin/python benchmarks/grammar_compile.py [--model DIR] [--repeats 5] [--vocab 32000]
        [--out benchmarks/results/grammar_compile.md]

1. One engine (the built-in model unless --model). A one-token completion is timed alone (median of
   --repeats), then again while another request compiles an expensive grammar: the open JSON
   schema's regex sent as a *regex* (not precompiled; outlines-core needs tens of seconds for it, so
   it runs into --grammar-compile-timeout and that request gets its 400). Reports both medians, the
   difference and the ratio, measured in the same run.
2. The first compile of the open schema `{}` and of json_object's `{"type": "object"}` in a fresh
   engine, as a request sees it (make_request: build + compile + the first mask), and in a
   ConstraintCompiler for a byte-level BPE tokenizer of --vocab tokens trained here (the tokenizer's
   tables included: they are built once per tokenizer).
"""

import argparse
import asyncio
import json
import os
import platform
import site
import statistics
import subprocess
import sys
import time
from pathlib import Path

from vlserve import Engine
from vlserve.bench.report import write_report
from vlserve.constrained import ConstraintCompiler, ConstraintError
from vlserve.constrained.schema import schema_to_regex

SCHEMAS = (("open", {}), ("object", {"type": "object"}))
PLAIN = {"prompt": "USER: hi ASSISTANT:", "sampling_params": {"max_new_tokens": 1}}


async def _one_token(engine) -> float:
    start = time.perf_counter()
    await engine.async_generate(**PLAIN)
    return time.perf_counter() - start


async def _beside_a_compile(engine, repeats: int) -> dict:
    alone = [await _one_token(engine) for _ in range(repeats + 1)][1:]  # the first warms the engine up
    expensive = asyncio.ensure_future(engine.async_generate(
        prompt="USER: hi ASSISTANT:", sampling_params={"max_new_tokens": 4, "regex": schema_to_regex({})}))
    compile_started = time.perf_counter()
    await asyncio.sleep(0.5)  # the compile is under way in a worker
    during = []
    for _ in range(repeats):
        during.append(await _one_token(engine))
        assert not expensive.done(), "the expensive grammar finished compiling before the measurement ended"
    try:
        await expensive
        outcome = "compiled"
    except ConstraintError as e:
        outcome = f"400: {e}"
    return {"alone": alone, "during": during, "outcome": outcome,
            "expensive_s": time.perf_counter() - compile_started}


def _first_compiles(engine) -> dict:
    out = {}
    for name, schema in SCHEMAS:
        start = time.perf_counter()
        engine.make_request(prompt="x", sampling_params={"json_schema": json.dumps(schema)})
        out[name] = time.perf_counter() - start
    return out


def train_tokenizer(vocab_size: int):
    """A byte-level BPE of `vocab_size` tokens, trained on the Python sources in site-packages (enough
    distinct text for a GPT-2-sized vocabulary)."""
    from transformers import PreTrainedTokenizerFast

    from vlserve.testing.bpe import train_byte_level_bpe

    files = sorted(Path(site.getsitepackages()[0]).glob("*/**/*.py"))[:3000]
    tok = train_byte_level_bpe([f.read_text(errors="ignore") for f in files], vocab_size, ["<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def _first_compiles_at_vocab(vocab: int) -> dict:
    tok = train_tokenizer(vocab)
    compiler = ConstraintCompiler(tok)
    out = {"vocab": len(tok)}
    for name, schema in SCHEMAS:
        start = time.perf_counter()
        compiled = compiler.compile(json_schema=json.dumps(schema))
        out[name] = time.perf_counter() - start
        masks = time.perf_counter()
        for state in list(compiled.byte_dfa.transitions)[:50]:
            compiled.mask(state)
        out[f"{name} mask"] = (time.perf_counter() - masks) / 50
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--out", default="benchmarks/results/grammar_compile.md")
    args = ap.parse_args()
    with Engine(args.model) as engine:
        first = _first_compiles(engine)
        beside = asyncio.run(_beside_a_compile(engine, args.repeats))
        timeout = engine.args.grammar_compile_timeout
    at_vocab = _first_compiles_at_vocab(args.vocab)
    alone, during = statistics.median(beside["alone"]), statistics.median(beside["during"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    ms = lambda s: f"{s * 1000:.0f} ms"  # noqa: E731
    lines = [
        "# Grammar compilation beside other requests",
        "",
        f"`.venv/bin/python benchmarks/grammar_compile.py {' '.join(sys.argv[1:])}` at {commit}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (shared), "
        f"model {args.model or 'built-in'}, --grammar-compile-timeout {timeout:g}.",
        "",
        "## A one-token completion while another request compiles an expensive grammar",
        "",
        "| one-token completion | median | runs |",
        "| --- | ---: | --- |",
        f"| alone | {ms(alone)} | {', '.join(ms(s) for s in beside['alone'])} |",
        f"| during the compile | {ms(during)} | {', '.join(ms(s) for s in beside['during'])} |",
        "",
        f"Difference {ms(during - alone)}, ratio {during / alone:.2f}. The expensive request (the open "
        f"schema's regex as a regex): {beside['outcome']} after {beside['expensive_s']:.1f} s.",
        "",
        "## First compile of the precompiled JSON automata",
        "",
        "| tokenizer | `{}` | `{\"type\": \"object\"}` | first mask per state |",
        "| --- | ---: | ---: | ---: |",
        f"| engine's (make_request, fresh engine) | {ms(first['open'])} | {ms(first['object'])} | |",
        f"| byte-level BPE, {at_vocab['vocab']} tokens (tables built in the first) | {ms(at_vocab['open'])} | "
        f"{ms(at_vocab['object'])} | {at_vocab['open mask'] * 1000:.1f} ms |",
        "",
    ]
    write_report(args.out, "\n".join(lines))


if __name__ == "__main__":
    main()
