"""Compare token-automaton libraries for constrained decoding: outlines-core, xgrammar, llguidance.

For each library and each constraint it measures
  compile_ms   building the token-level automaton from scratch (no cache), and
  mask_us      the per-step cost of producing the allowed-token bitmask, averaged over a random
               valid walk (advance included),
on two byte-level BPE tokenizers trained here: a tiny one (~2k vocab, a few KB of JSON-ish and
English text, like the tests) and a GPT-2-sized one (32k vocab, trained on the Python sources of
the installed packages).

    .venv/bin/python benchmarks/constrained_libs.py [--vocab 2000 32000] [--steps 64]

Prints a Markdown table. Single-threaded torch; the libraries may use their own threads.
"""

from __future__ import annotations

import argparse
import json
import random
import site
import time
from pathlib import Path

import torch

REGEXES = {
    "email": r"[a-z]{3,10}@[a-z]{3,8}\.(com|org|net)",
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "ip": r"((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)",
}
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer"},
            "is_student": {"type": "boolean"},
            "house": {"enum": ["Gryffindor", "Hufflepuff", "Ravenclaw", "Slytherin"]},
        },
        "required": ["name", "age", "is_student", "house"],
    },
    "order": {
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{6}$"},
            "customer": {
                "type": "object",
                "properties": {"first_name": {"type": "string"}, "last_name": {"type": "string"}},
                "required": ["first_name", "last_name"],
            },
            "items": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
            "total_price": {"type": "number"},
            "status": {"enum": ["pending", "shipped", "delivered"]},
        },
        "required": ["order_id", "customer", "items", "total_price", "status"],
    },
}

SMALL_TEXT = (
    '{"name": "Alice", "age": 30, "is_student": false, "email": "alice@example.com"}\n'
    '{"order_id": "ABC-123456", "items": ["apple", "bread"], "total_price": 12.5}\n'
    "The quick brown fox jumps over the lazy dog. A serving system answers questions about images.\n"
    "Call (555) 123-4567 or write to bob@mail.org before 10.0.0.1 goes down.\n"
)


def train_tokenizer(vocab_size: int):
    from vlserve.model.bpe import train_byte_level_bpe
    from transformers import PreTrainedTokenizerFast

    if vocab_size <= 4000:
        corpus = [SMALL_TEXT] * 20
    else:  # enough distinct text for a GPT-2-sized vocabulary
        files = sorted(Path(site.getsitepackages()[0]).glob("*/**/*.py"))[:3000]
        corpus = [f.read_text(errors="ignore") for f in files]
    tok = train_byte_level_bpe(corpus, vocab_size, ["<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def random_walk(steps: int, fill, allowed_ids, advance, rng: random.Random) -> float:
    """Run up to `steps` steps of fill mask (timed) → pick an allowed token → advance (timed).
    Return mean seconds per step."""
    total, n = 0.0, 0
    for _ in range(steps):
        _, dt = timed(fill)
        allowed = allowed_ids()
        n += 1
        if not allowed:
            break
        tok = rng.choice(allowed)
        done, dt_advance = timed(lambda: advance(tok))
        total += dt + dt_advance
        if done:
            break
    return total / max(n, 1)


def bits_to_ids(bitmask: torch.Tensor, vocab: int) -> list[int]:
    bits = (bitmask.view(-1, 1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.view(-1)[:vocab].nonzero().view(-1).tolist()


# ---- outlines-core -------------------------------------------------------------------------


def bench_outlines(hf, kind: str, spec, steps: int, rng):
    import outlines_core as oc

    from vlserve.constrained.vocab import token_bytes_table

    eos = hf.eos_token_id
    table = token_bytes_table(hf)
    mapping: dict[bytes, list[int]] = {}
    for tid, b in enumerate(table):
        if b is not None and tid != eos:
            mapping.setdefault(b, []).append(tid)
    vocab = oc.Vocabulary(eos, mapping)
    regex = spec if kind == "regex" else oc.json_schema.build_regex_from_schema(json.dumps(spec), "")
    index, dt = timed(lambda: oc.Index(regex, vocab))
    guide = oc.Guide(index)
    bitmask = torch.zeros((len(hf) + 31) // 32, dtype=torch.int32)

    def fill():
        guide.write_mask_into(bitmask.data_ptr(), bitmask.numel(), 4)

    def advance(tok):
        if tok == eos:
            return True
        guide.advance(tok)
        return guide.is_finished()

    return dt, random_walk(steps, fill, lambda: bits_to_ids(bitmask, len(hf)), advance, rng)


# ---- xgrammar ------------------------------------------------------------------------------


def bench_xgrammar(hf, kind: str, spec, steps: int, rng):
    import xgrammar as xg

    info = xg.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf), stop_token_ids=[hf.eos_token_id])
    compiler = xg.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    if kind == "regex":
        compiled, dt = timed(lambda: compiler.compile_regex(spec))
    else:
        compiled, dt = timed(
            lambda: compiler.compile_json_schema(json.dumps(spec), any_whitespace=False)
        )
    matcher = xg.GrammarMatcher(compiled)
    bitmask = xg.allocate_token_bitmask(1, len(hf))

    def fill():
        matcher.fill_next_token_bitmask(bitmask)

    def advance(tok):
        matcher.accept_token(tok)
        return matcher.is_terminated()

    return dt, random_walk(steps, fill, lambda: bits_to_ids(bitmask[0], len(hf)), advance, rng)


# ---- llguidance ----------------------------------------------------------------------------


def bench_llguidance(hf, kind: str, spec, steps: int, rng):
    import llguidance as llg
    import llguidance.hf
    import llguidance.torch

    tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=len(hf))
    if kind == "regex":
        grammar = llg.LLMatcher.grammar_from_regex(spec)
    else:
        grammar = llg.LLMatcher.grammar_from_json_schema(
            spec, defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        )
    matcher, dt = timed(lambda: llg.LLMatcher(tokenizer, grammar))
    assert not matcher.is_error(), matcher.get_error()
    bitmask = llguidance.torch.allocate_token_bitmask(1, len(hf))

    def fill():
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)

    def advance(tok):
        matcher.consume_token(tok)
        return matcher.is_stopped()

    return dt, random_walk(steps, fill, lambda: bits_to_ids(bitmask[0], len(hf)), advance, rng)


_COMPILERS: dict[int, object] = {}


def bench_ours(hf, kind: str, spec, steps: int, rng, cached: bool = False):
    """The chosen path as the engine uses it: one ConstraintCompiler per tokenizer (its vocabulary
    tables are built once, outside the timing), per-state bool masks built on first visit."""
    from vlserve.constrained import ConstraintCompiler, ConstraintState

    if id(hf) not in _COMPILERS:
        _COMPILERS.clear()
        _COMPILERS[id(hf)] = ConstraintCompiler(hf)
        _COMPILERS[id(hf)].token_vocab()
    compiler = _COMPILERS[id(hf)]
    arg = {"regex": spec} if kind == "regex" else {"json_schema": spec}
    compiler._cache.clear()  # time a real compile, not a cache hit
    compiled, dt = timed(lambda: compiler.compile(**arg))
    row = torch.zeros(len(hf), dtype=torch.bool)

    def walk(seed_rng):
        state = ConstraintState(compiled)

        def fill():
            state.fill_allowed_mask(row)

        def advance(tok):
            state.advance(tok)
            return state.is_terminated()

        return random_walk(steps, fill, lambda: row.nonzero().view(-1).tolist(), advance, seed_rng)

    first = walk(random.Random(0))
    again = walk(random.Random(0))  # same walk: every state's mask is cached now
    return dt, again if cached else first


LIBS = {
    "outlines-core": bench_outlines,
    "xgrammar": bench_xgrammar,
    "llguidance": bench_llguidance,
    "vlserve, first visit of each state": bench_ours,
    "vlserve, cached masks": lambda *a: bench_ours(*a, cached=True),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, nargs="+", default=[2000, 32000])
    ap.add_argument("--steps", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cases = [("regex", k, v) for k, v in REGEXES.items()] + [
        ("json_schema", k, v) for k, v in SCHEMAS.items()
    ]
    print("| vocab | library | constraint | compile_ms | mask_us/step |")
    print("| --- | --- | --- | ---: | ---: |")
    for vocab_size in args.vocab:
        hf, dt = timed(lambda: train_tokenizer(vocab_size))
        for lib, fn in LIBS.items():
            for kind, name, spec in cases:
                compile_s, step_s = fn(hf, kind, spec, args.steps, random.Random(0))
                print(
                    f"| {len(hf)} | {lib} | {kind}:{name} | {compile_s * 1e3:.1f} | {step_s * 1e6:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
