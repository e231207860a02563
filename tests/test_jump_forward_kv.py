"""Jump-forward at the engine level: a retokenised tail's KV is rewound and recomputed, so what the
radix tree keeps after a jump is exactly the KV of the retokenised ids.

A sampler that always picks the shortest allowed token (one byte where it can) makes the model
spell JSON string values byte by byte; each forced `", "key": ` then re-encodes the tail into longer
BPE tokens, so jumps rewrite tokens whose KV is already computed — the case a missing rewind gets
wrong. Bugs caught: a jump that does not rewind KV (stale KV enters the tree and later requests
reuse it), a jump applied to tree-owned tokens, a wrong kv_len after the rewind.
"""

import json

import pytest
import torch

from vlserve import Engine
from vlserve.constrained.vocab import token_bytes_table
from vlserve.testing.tiny import make_tiny_model

# A boolean first: after the model picks `t` (or `f`), the jump re-encodes `t` + `rue, "name": "`
# into new tokens mid-output, so the rewound KV is recomputed and later enters the tree.
SCHEMA = {"type": "object", "properties": {"student": {"type": "boolean"},
                                           "name": {"type": "string", "maxLength": 10},
                                           "married": {"type": "boolean"},
                                           "city": {"type": "string", "maxLength": 10}},
          "required": ["student", "name", "married", "city"]}
PROMPT = "USER: describe a person as JSON ASSISTANT:"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("jfkv")), seed=5)


def _shortest_allowed_sampler(tokenizer):
    lengths = torch.tensor([len(b) if b and b.isascii() else 10**6 for b in token_bytes_table(tokenizer)],
                           dtype=torch.float64)

    def sample(logits, params, generators):  # the batched sampler's signature
        n = min(logits.shape[1], lengths.shape[0])
        cost = torch.where(torch.isfinite(logits[:, :n]), lengths[:n], float("inf"))
        # the shortest allowed ASCII token; among equals the model's favourite
        best = cost.min(dim=1, keepdim=True).values
        ids = torch.where(cost == best, logits[:, :n].double(), -float("inf")).argmax(dim=1)
        return ids, torch.log_softmax(logits, dim=-1).gather(1, ids[:, None]).squeeze(1)
    return sample


@pytest.fixture(scope="module")
def jumped(model_dir):
    """Runs the constrained request with byte-level picks; returns (engine, full sequence, rewinds)."""
    engine = Engine(model_dir, max_total_tokens=4096)
    real = engine.runner.sampler
    engine.runner.sampler = _shortest_allowed_sampler(engine.tokenizer)  # for this request only
    rewinds = []
    cm = engine.scheduler.cm
    real_rewind = cm.rewind
    cm.rewind = lambda req, n: (rewinds.append((req.kv_len, n)), real_rewind(req, n))[1]
    try:
        out = engine.generate(prompt=PROMPT, sampling_params={"json_schema": json.dumps(SCHEMA), "max_new_tokens": 96})
        assert engine.wait_idle()
    finally:
        engine.runner.sampler = real
        cm.rewind = real_rewind
    prompt_ids = engine.make_request(prompt=PROMPT).input_ids
    yield engine, out, prompt_ids + out["output_ids"], rewinds
    engine.shutdown()


def test_the_case_is_forced_jumps_rewrite_computed_kv(jumped):
    engine, out, _, rewinds = jumped
    json.loads(out["text"])  # a complete, valid object
    assert out["meta_info"]["finish_reason"] == "stop"
    assert any(new < old for old, new in rewinds), f"no jump rewound computed KV: {rewinds}"
    engine.scheduler.cm.check_idle_accounting()
    engine.scheduler.cm.cache.check_integrity()


def test_kv_in_the_tree_after_jumps_equals_fresh_kv(jumped, model_dir):
    engine, _, seq, rewinds = jumped
    cached = engine.scheduler.cm.cache.match_prefix(seq)
    # rewound positions were recomputed and entered the tree (a final forced tail, after which only
    # EOS is allowed, finishes the request before its KV is computed, so it is not in the tree)
    assert any(new < old and new < cached.prefix_len for old, new in rewinds)
    with Engine(model_dir, max_total_tokens=4096) as fresh:
        fresh.generate(input_ids=seq, sampling_params={"max_new_tokens": 0})
        assert fresh.wait_idle()
        ref = fresh.scheduler.cm.cache.match_prefix(seq)
        n = min(cached.prefix_len, ref.prefix_len)
        for layer, (k, v) in enumerate(zip(engine.memory.kv.k_buffers, engine.memory.kv.v_buffers)):
            fk, fv = fresh.memory.kv.k_buffers[layer], fresh.memory.kv.v_buffers[layer]
            torch.testing.assert_close(k[cached.indices[:n]], fk[ref.indices[:n]], atol=1e-4, rtol=1e-4,
                                       msg=lambda m: f"layer {layer} K after jumps differs from fresh KV: {m}")
            torch.testing.assert_close(v[cached.indices[:n]], fv[ref.indices[:n]], atol=1e-4, rtol=1e-4,
                                       msg=lambda m: f"layer {layer} V after jumps differs from fresh KV: {m}")


def test_a_continuation_from_the_cache_equals_a_recomputation(jumped, model_dir):
    engine, _, seq, rewinds = jumped
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    follow = engine.generate(input_ids=seq, sampling_params=params)
    cached = follow["meta_info"]["cached_tokens"]
    assert any(new < old and new < cached for old, new in rewinds)  # served from KV rewritten by jumps
    with Engine(model_dir, max_total_tokens=4096, disable_radix_cache=True) as fresh:
        again = fresh.generate(input_ids=seq, sampling_params=params)
    assert follow["output_ids"] == again["output_ids"]
