"""Average the weights of checkpoints of one model shape (a "model soup"): the built-in model's
ninth and tenth stages are each a fine-tuning averaged with the stage it started from, the eleventh
three sibling fine-tunings (one start, one recipe, three seeds) averaged with their start.

    python -m training.builtin.average --out DIR STAGE11_A:0.25 RUN96:0.25 RUN98:0.25 RUN99:0.25

Every file other than the weights (config, tokenizer, processor, chat template) is the first
checkpoint's; the weights are the weighted sum, tensor by tensor, and the shares must add up to 1.
A checkpoint at another image size (stage 16: 128 px from a 96-px start) joins with its vision
position table resampled to the first's grid, as a warm start at that size begins from it.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"
POSITION_TABLE = "vision_tower.embeddings.position_embedding.weight"  # its key as save_pretrained writes it


def _on_grid_of(state: dict[str, torch.Tensor], first: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with its vision position table resampled to `first`'s patch grid, where they differ."""
    from training.builtin.train import resized_position_embedding

    want = first[POSITION_TABLE].shape[0]
    if state[POSITION_TABLE].shape[0] == want:
        return state
    grid = round((want - 1) ** 0.5)
    return state | {POSITION_TABLE: resized_position_embedding(state[POSITION_TABLE].float(), grid)}


def average(out: Path, parts: list[tuple[Path, float]]) -> None:
    if abs(sum(share for _, share in parts) - 1.0) > 1e-6:
        raise ValueError(f"shares add up to {sum(s for _, s in parts)}, not 1")
    states = [(load_file(path / WEIGHTS), share) for path, share in parts]
    first = states[0][0]
    states = [(_on_grid_of(state, first), share) for state, share in states]
    for state, _ in states[1:]:
        if {k: v.shape for k, v in state.items()} != {k: v.shape for k, v in first.items()}:
            raise ValueError("the checkpoints differ in shape")
    mixed = {k: sum(share * state[k].float() for state, share in states).to(first[k].dtype) for k in first}
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(parts[0][0], tmp, ignore=shutil.ignore_patterns(WEIGHTS, "*.csv"))
    save_file(mixed, tmp / WEIGHTS, metadata={"format": "pt"})
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main() -> None:
    p = argparse.ArgumentParser(description="Average checkpoints' weights.")
    p.add_argument("--out", required=True, help="the averaged checkpoint's directory")
    p.add_argument("parts", nargs="+", metavar="DIR:SHARE", help="a checkpoint and its share of the average")
    a = p.parse_args()
    parts = [(Path(d), float(s)) for d, s in (part.rsplit(":", 1) for part in a.parts)]
    average(Path(a.out), parts)
    print(f"[average] wrote {a.out}")


if __name__ == "__main__":
    main()
