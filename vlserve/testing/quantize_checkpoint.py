"""Quantizes a LLaVA-family checkpoint with llm-compressor's `oneshot`, as its users do, into a
compressed-tensors checkpoint vlserve loads (vlserve/model/compressed_tensors.py).

Runs in the llm-compressor environment (`.venv-llmc`, made by `scripts/run.sh setup`: llm-compressor
pins older transformers and compressed-tensors than vlserve's), as a script, so it imports nothing of
vlserve:

    .venv-llmc/bin/python vlserve/testing/quantize_checkpoint.py SRC OUT --scheme w8a8
    .venv-llmc/bin/python vlserve/testing/quantize_checkpoint.py SRC OUT --scheme w4a16 --group-size 64 --asymmetric

Schemes (data-free: round-to-nearest, no calibration set):
- w8a8: int8 weights per output channel, symmetric; int8 activations per token, dynamic (the
  compressed-tensors preset "W8A8"); saved int8 under the plain name `weight` with `weight_scale`.
- w4a16: int4 weights in groups of --group-size along the input, symmetric or --asymmetric,
  activations left in full precision; saved pack-quantized (`weight_packed`, `weight_scale`,
  `weight_shape`, and `weight_zero_point` when asymmetric).
The vision tower, the projector and lm_head stay in full precision (the usual ignore list).
"""

import argparse
import os
import shutil

IGNORE = ["lm_head", "re:.*vision_tower.*", "re:.*multi_modal_projector.*"]
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def recipe(scheme: str, group_size: int, asymmetric: bool):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor.modifiers.quantization import QuantizationModifier

    if scheme == "w8a8":
        return QuantizationModifier(targets="Linear", scheme="W8A8", ignore=IGNORE)
    if scheme != "w4a16":
        raise SystemExit(f"unknown scheme {scheme!r}: w8a8 or w4a16")
    weights = QuantizationArgs(num_bits=4, type="int", strategy="group", group_size=group_size,
                               symmetric=not asymmetric, dynamic=False)
    return QuantizationModifier(config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights)},
                                ignore=IGNORE)


def model_class(src: str):
    """transformers' class for the checkpoint's architecture (any LLaVA family)."""
    import transformers
    from transformers import AutoConfig

    arch = AutoConfig.from_pretrained(src).architectures[0]
    return getattr(transformers, arch)


def copy_side_files(src: str, out: str) -> None:
    """Tokenizer, processor and chat-template files: everything but the weights and config.json."""
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if os.path.isfile(path) and name not in WEIGHT_FILES + ("config.json",) and not name.endswith(".safetensors"):
            shutil.copy(path, os.path.join(out, name))


def quantize(src: str, out: str, scheme: str, group_size: int = 128, asymmetric: bool = False) -> str:
    from llmcompressor import oneshot

    model = model_class(src).from_pretrained(src, dtype="auto")
    oneshot(model=model, recipe=recipe(scheme, group_size, asymmetric))
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, save_compressed=True)
    copy_side_files(src, out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="a full-precision checkpoint directory")
    p.add_argument("out", help="where the compressed checkpoint goes")
    p.add_argument("--scheme", choices=("w8a8", "w4a16"), required=True)
    p.add_argument("--group-size", type=int, default=128,
                   help="w4a16: input elements per scale (divides every input size)")
    p.add_argument("--asymmetric", action="store_true", help="w4a16: a zero point per group")
    a = p.parse_args()
    print(quantize(a.src, a.out, a.scheme, a.group_size, a.asymmetric))


if __name__ == "__main__":
    main()
