"""compressed-tensors checkpoints written by llm-compressor itself, served by vlserve and checked
against transformers loading the same compressed checkpoint.

llm-compressor runs in its own environment (.venv-llmc, made by `scripts/run.sh setup`; it pins older
transformers and compressed-tensors than vlserve's): vlserve/testing/quantize_checkpoint.py
quantizes tiny random checkpoints with `oneshot` (W8A8-int8; W4A16 symmetric and asymmetric), and
vlserve/testing/compressed_reference.py runs transformers on them, greedy, each prompt alone, writing
its logits to a file. vlserve's paged runner then prefills the same prompts in one batch and decodes
the reference's tokens, and every step is compared:

- W8A8 tolerances. Both sides quantize each activation row at run time (scale max|x| / 127.5,
  round half to even); where an activation lies within float rounding of a half step, the two sides
  (whose upstream sums differ in the last bits: batched paged attention against transformers' SDPA)
  may round it to neighbouring integers, a change of one step (max|x| / 127.5, ~0.8% of the row's
  largest value) in one input of one layer. Measured on these models: top-5 log-probabilities
  within 2e-3 nats of the reference. Allowed: INT8_LOGPROB_TOL = 0.02 nats (10x that; a wrong
  scale divisor, 127 against 127.5, alone moves them ~0.4% of their size), and the greedy ids equal
  wherever the reference's top two are more than INT8_TIE_MARGIN = 0.02 nats apart.
- W4A16 has no run-time rounding: the weights are the same numbers on both sides, and the logits
  differ only in float summation order (measured 3e-7): tolerance 1e-4, greedy ids equal everywhere
  but exact ties (margin 1e-4).
"""

import os
import subprocess

import pytest
import torch

from helpers.runner_helpers import batched_logits
from vlserve.core.errors import CheckpointError
from vlserve.model.loader import load_model
from vlserve.model.quantized_linear import (
    INT4_PREFILL_ROWS, Int4Linear, Int8Linear, QuantizedLinear, QuantizedRows,
)
from vlserve.runner.model_runner import ModelRunner
from vlserve.testing.tiny import TinyModelSpec, make_tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLMC_PYTHON = os.path.join(os.environ.get("VLSERVE_LLMC_VENV", os.path.join(ROOT, ".venv-llmc")), "bin", "python")
TESTING = os.path.join(ROOT, "vlserve", "testing")  # quantize_checkpoint.py, compressed_reference.py
STEPS = 12
INT8_LOGPROB_TOL, INT8_TIE_MARGIN = 0.02, 0.02
INT4_LOGPROB_TOL, INT4_TIE_MARGIN = 1e-4, 1e-4

# (scheme flags, text model, tolerance, tie margin, layer class): both int4 variants, a Qwen2
# decoder's q/k/v biases beside a quantized weight
CASES = {
    "w8a8-llama": (["--scheme", "w8a8"], "llama", INT8_LOGPROB_TOL, INT8_TIE_MARGIN, Int8Linear),
    "w4a16-sym-g32-qwen2": (["--scheme", "w4a16", "--group-size", "32"], "qwen2", INT4_LOGPROB_TOL,
                            INT4_TIE_MARGIN, Int4Linear),
    "w4a16-asym-g64-mistral": (["--scheme", "w4a16", "--group-size", "64", "--asymmetric"], "mistral",
                               INT4_LOGPROB_TOL, INT4_TIE_MARGIN, Int4Linear),
}


def run_llmc(code: str) -> None:
    """Python code run in the llm-compressor environment, with vlserve/testing's two scripts importable."""
    if not os.path.exists(LLMC_PYTHON):
        pytest.fail(f"the llm-compressor environment is missing ({LLMC_PYTHON}): `scripts/run.sh setup` makes it")
    code = f"import sys; sys.path.insert(0, {TESTING!r})\n" + code
    done = subprocess.run([LLMC_PYTHON, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"llm-compressor environment: {code!r} failed:\n{done.stderr[-3000:]}"


def prompts(cfg, gen) -> list[dict]:
    """Text only, an image first, two images, and a long one: prefilled together they pass
    INT4_PREFILL_ROWS rows (the W4A16 prefill path); each decode step is 4 rows (the in-register path)."""
    img, n = cfg.image_token_id, cfg.tokens_per_image

    def text(k):
        return torch.randint(5, cfg.text.vocab_size, (k,), generator=gen).tolist()

    def pixels(k):
        return torch.randn(k, 3, cfg.image_size, cfg.image_size, generator=gen)

    return [{"ids": text(7), "pixel_values": None},
            {"ids": [img] * n + text(5), "pixel_values": pixels(1)},
            {"ids": text(3) + [img] * n + text(4) + [img] * n + text(2), "pixel_values": pixels(2)},
            {"ids": text(60) + [img] * n + text(3), "pixel_values": pixels(1)}]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """name -> (compressed checkpoint, prompts, the reference's output) for every case, made at once:
    llm-compressor quantizes each, then transformers runs the prompts on the results, all in one call
    to its environment (importing llm-compressor is most of a call's time)."""
    made, code = {}, ["import quantize_checkpoint as q, compressed_reference as r"]
    for name, (flags, text, *_) in CASES.items():
        root = tmp_path_factory.mktemp(name)
        src, out, ref = str(root / "fp32"), str(root / "quantized"), str(root / "ref.pt")
        make_tiny_model(src, seed=3, spec=TinyModelSpec(text=text, intermediate_size=192))
        reqs = prompts(load_model(src).config, torch.Generator().manual_seed(0))
        torch.save(reqs, root / "prompts.pt")
        code += [f"sys.argv = ['quantize_checkpoint', {src!r}, {out!r}] + {flags!r}; q.main()",
                 f"sys.argv = ['compressed_reference', {out!r}, {str(root / 'prompts.pt')!r}, {ref!r}, "
                 f"'--steps', '{STEPS}']; r.main()"]
        made[name] = (out, reqs, ref)
    run_llmc("\n".join(code))
    return {name: (out, reqs, torch.load(ref)) for name, (out, reqs, ref) in made.items()}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, quantized):
    out, reqs, ref = quantized[request.param]
    tol, margin, layer = CASES[request.param][2:]
    return load_model(out), reqs, ref, tol, margin, layer


def test_exactly_the_decoder_linears_are_quantized(case):
    loaded, _, ref, _, _, layer = case
    model = loaded.model
    quantized = [n for n, m in model.named_modules() if isinstance(m, QuantizedLinear)]
    layers = loaded.config.text.num_layers
    assert len(quantized) == 4 * layers  # qkv_proj, o_proj, gate_up_proj, down_proj (fused at load)
    assert all(isinstance(m, layer) and m.packed is not None for m in model.modules() if isinstance(m, QuantizedLinear))
    assert all(n.startswith("language_model.layers.") for n in quantized)
    # the vision tower, projector and lm_head stayed in full precision, on both sides
    assert 7 * layers == len(ref["quantized"]) and not any("vision" in n or "lm_head" in n for n in ref["quantized"])


def test_logits_match_transformers_on_the_compressed_checkpoint(case):
    loaded, reqs, ref, tol, margin, _ = case
    cfg = loaded.config
    runner = ModelRunner.standalone(loaded, max_total_tokens=2048, page_size=4)
    batch = [(r["ids"], 0 if r["pixel_values"] is None else r["pixel_values"].shape[0]) for r in reqs]
    ref_logits = ref["logits"]
    assert sum(len(ids) for ids, _ in batch) >= INT4_PREFILL_ROWS > len(batch)  # both W4A16 paths run
    native = batched_logits(runner, cfg, batch, [r["pixel_values"] for r in reqs], STEPS,
                            lambda step, logits: [int(r[step].argmax()) for r in ref_logits])
    compared = 0
    for i, (ours, theirs) in enumerate(zip(native, ref_logits)):
        for step, (a, b) in enumerate(zip(ours, theirs)):
            la, lb = a.float().log_softmax(-1), b.log_softmax(-1)
            top2 = lb.topk(2).values
            if top2[0] - top2[1] > margin:
                assert int(a.argmax()) == int(b.argmax()), f"request {i} step {step}: greedy ids differ"
                compared += 1
            top5 = lb.topk(5).indices
            diff = (la[top5] - lb[top5]).abs().max().item()
            assert diff <= tol, f"request {i} step {step}: top-5 log-probs differ by {diff:.2e} (tolerance {tol})"
    # tiny random models' logits are nearly flat: the margin excuses many steps, but never most of them
    assert compared >= len(reqs) * (STEPS + 1) // 2, f"only {compared} steps had a clear greedy choice"


def test_w8a8_norms_quantize_for_the_projections_after_them(quantized, monkeypatch):
    """q/k/v and gate/up read the int8 rows their RMSNorm wrote, down_proj those SiLU * up wrote (one
    quantization, in the pass before): the logits are exactly those of every layer quantizing its own
    float input."""
    out, reqs, ref = quantized["w8a8-llama"]
    batch = [(r["ids"], 0 if r["pixel_values"] is None else r["pixel_values"].shape[0]) for r in reqs]
    inputs = []  # per Int8Linear call: whether its input came quantized
    forward = Int8Linear.forward
    monkeypatch.setattr(Int8Linear, "forward", lambda self, x: inputs.append(isinstance(x, QuantizedRows))
                        or forward(self, x))

    def logits():
        loaded = load_model(out)
        runner = ModelRunner.standalone(loaded, max_total_tokens=2048, page_size=4)
        return batched_logits(runner, loaded.config, batch, [r["pixel_values"] for r in reqs], 3,
                              lambda step, _: [int(r[step].argmax()) for r in ref["logits"]])

    fused = logits()
    assert inputs and inputs.count(True) == 3 * inputs.count(False)  # qkv, gate_up, down: rows; o: float
    inputs.clear()
    monkeypatch.setattr(Int8Linear, "reads_quantized_rows", lambda self: False)
    apart = logits()
    assert inputs and not any(inputs)
    for i, (a, b) in enumerate(zip(fused, apart)):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), f"request {i}: logits differ"


def _with_quantization_config(src: str, dst: str, qc: dict) -> str:
    import json
    import shutil

    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = qc
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    return dst


FP8_GROUP = {"format": "float-quantized", "targets": ["Linear"], "input_activations": None,
             "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}}


@pytest.mark.parametrize("qc, named", [
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": FP8_GROUP}},
     "float-quantized"),
    ({"quant_method": "compressed-tensors", "config_groups": {},
      "sparsity_config": {"format": "sparse-24-bitmask", "sparsity_structure": "2:4"}}, "sparse-24-bitmask"),
    ({"quant_method": "awq", "bits": 4}, "'awq'"),
], ids=["fp8", "2:4-sparse", "awq"])
def test_other_schemes_are_refused_at_start_up_naming_them(tmp_path, qc, named):
    src = make_tiny_model(str(tmp_path / "fp32"), seed=0)
    path = _with_quantization_config(src, str(tmp_path / "q"), qc)
    with pytest.raises(CheckpointError, match="not served") as e:
        load_model(path)
    assert named in str(e.value)


def test_gpu_dequantizes_at_load_and_says_so(quantized, caplog):
    """No quantized GPU kernels: on another device the weights are dequantized into plain linears
    (checked here by the loader's own path for non-CPU devices, on the meta device)."""
    import logging

    from vlserve.model.quantized_linear import apply_compressed_tensors
    from vlserve.model.loader import check_checkpoint_dir, read_state_dict
    from vlserve.model.families import family_for
    from transformers import AutoConfig

    out = quantized["w8a8-llama"][0]
    hf = AutoConfig.from_pretrained(out)
    family = family_for(hf)
    cfg = family.config_from_hf(hf)
    with torch.device("meta"):
        model = family.build_model(cfg)
    state = read_state_dict(check_checkpoint_dir(out), torch.float32)
    with caplog.at_level(logging.INFO, logger="vlserve.model.quantized_linear"):
        apply_compressed_tensors(out, model, state, "cuda", torch.bfloat16)
    assert "dequantized at load to torch.bfloat16 on cuda" in caplog.text
    w = state["language_model.layers.0.mlp.down_proj.weight"]
    assert w.dtype == torch.bfloat16 and not any(k.endswith("weight_scale") for k in state)



def test_tensor_parallelism_refuses_quantized_layers(quantized):
    from vlserve.model.tensor_parallel import TPContext, shard_model

    loaded = load_model(quantized["w8a8-llama"][0])
    with pytest.raises(CheckpointError, match="does not shard quantized"):
        shard_model(loaded.model, TPContext(rank=0, size=2))
