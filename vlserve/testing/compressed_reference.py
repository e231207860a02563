"""The reference for compressed-tensors checkpoints: transformers loading the checkpoint itself
(compressed-tensors decompresses it, and quantizes W8A8 activations per token at run time), greedy
decoding each prompt alone, writing every step's logits to a file.

Runs in the llm-compressor environment (`.venv-llmc`), as a script, importing nothing of vlserve:

    .venv-llmc/bin/python vlserve/testing/compressed_reference.py CHECKPOINT PROMPTS.pt OUT.pt --steps 16

The checkpoint's `ignore` list is written in checkpoint-key form ("language_model.lm_head",
"vision_tower.encoder..."), which does not match transformers' module names ("lm_head",
"model.vision_tower..."): left as it is, transformers would "quantize" the vision tower, the projector
and lm_head with scales the checkpoint lacks (initialised at random). So the list is rewritten in
module-name form from the tensors themselves: a linear is quantized if and only if the checkpoint has
its `weight_scale`.

PROMPTS.pt: a list of {"ids": [int], "pixel_values": tensor [k, 3, H, W] or None}. OUT.pt: per prompt
a [steps + 1, vocab] fp32 tensor, the logits after the prompt and after each greedy token (the
token chosen is each row's argmax), and "quantized": the names of the linear layers transformers
ran quantized.
"""

import argparse
import json
import os

import torch

# name parts that transformers' and the checkpoints' layouts add or drop between them
LAYOUT_PARTS = {"model", "language_model"}


def greedy_logits(model, ids: list[int], pixel_values, steps: int) -> torch.Tensor:
    rows, past = [], None
    input_ids = torch.tensor([ids])
    for step in range(steps + 1):
        kwargs = {"pixel_values": pixel_values} if step == 0 and pixel_values is not None else {}
        out = model(input_ids=input_ids, past_key_values=past, use_cache=True, **kwargs)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        rows.append(logits)
        input_ids = logits.argmax().view(1, 1)
    return torch.stack(rows)


def quantized_layers(model) -> list[str]:
    """The linear layers compressed-tensors left a quantization scheme on."""
    return sorted(name for name, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and getattr(m, "quantization_scheme", None) is not None)


def layout_free(name: str) -> str:
    return ".".join(part for part in name.split(".") if part not in LAYOUT_PARTS)


def checkpoint_quantized(path: str) -> set[str]:
    """The checkpoint's linear layers that have a `weight_scale` (layout-free names)."""
    from safetensors import safe_open

    index = os.path.join(path, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else [
        "model.safetensors"]
    names = set()
    for file in files:
        with safe_open(os.path.join(path, file), framework="pt") as f:
            names |= {layout_free(k[:-len(".weight_scale")]) for k in f.keys() if k.endswith(".weight_scale")}
    return names


def load(path: str):
    """The model, with the ignore list in module-name form (see the module's docstring)."""
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    cls = getattr(transformers, config.architectures[0])
    quantized = checkpoint_quantized(path)
    with torch.device("meta"):
        names = [n for n, m in cls(config).named_modules() if isinstance(m, torch.nn.Linear)]
    qc = config.quantization_config
    qc = dict(qc) if isinstance(qc, dict) else qc.to_dict()
    qc["ignore"] = [n for n in names if layout_free(n) not in quantized]
    config.quantization_config = qc
    return cls.from_pretrained(path, config=config).eval()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("prompts")
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=16)
    a = p.parse_args()
    torch.set_num_threads(1)
    model = load(a.checkpoint)
    prompts = torch.load(a.prompts)
    with torch.inference_mode():
        logits = [greedy_logits(model, p["ids"], p["pixel_values"], a.steps) for p in prompts]
    torch.save({"logits": logits, "quantized": quantized_layers(model)}, a.out)


if __name__ == "__main__":
    main()
