"""Where a relation's two places are in the decoder: linear probes at the answer position.

    python -m training.builtin.probe_relations [--model DIR] [--n 800] [--seed 4242]

For yes/no relations measured from a named shape ("is the circle above the square?", typed.py), the
residual stream at the position that predicts the answer is read after every decoder layer. Ridge
probes, fitted on 70% of the questions and scored on the rest, give R² for each shape's visible
centre (x, y) and the accuracy of a probe for the answer itself; so a relation that stays at chance
shows whether a place never arrives, or arrives and is not compared. The teacher-forced accuracy of
the model's own answers is printed beside.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import LlavaForConditionalGeneration

from training.builtin.train import BatchMaker, build_image_processor, image_features, load_tokenizer
from vlserve.builtin import scenes, typed
from vlserve.model.builtin import BUILTIN_MODEL_DIR

COLUMNS = ("x of the asked-about shape", "y of the asked-about shape", "x of the reference", "y of the reference")
LAMBDAS = (0.1, 1.0, 10.0)


@dataclass
class Probed:
    residuals: list[np.ndarray]  # per layer boundary (0: embeddings), [questions, hidden]
    places: np.ndarray  # [questions, 4]: COLUMNS
    yes: np.ndarray  # [questions] bool: the expected answer
    correct: np.ndarray  # [questions] bool: the model's teacher-forced answer was right


def yes_no_relations(n: int, seed: int) -> list[tuple[scenes.Scene, scenes.QA]]:
    rng = random.Random(seed)
    out: list[tuple[scenes.Scene, scenes.QA]] = []
    while len(out) < n:
        scene = typed.typed_scene(rng)
        out += [(scene, qa) for qa in scene.qas
                if qa.qtype == typed.RELATION_QTYPE and qa.ref is not None and qa.answer in ("Yes.", "No.")]
    return out[:n]


@torch.no_grad()
def probe_inputs(model, maker: BatchMaker, items: list[tuple[scenes.Scene, scenes.QA]]) -> Probed:
    layers = model.config.text_config.num_hidden_layers + 1
    residuals: list[list[np.ndarray]] = [[] for _ in range(layers)]
    places, yes, correct = [], [], []
    for i in range(0, len(items), 16):
        chunk = items[i:i + 16]
        batch = maker.make_turns([[(scene, qa)] for scene, qa in chunk])
        inner = model.model
        embeds = inner.get_input_embeddings()(batch.input_ids)
        is_image = (batch.input_ids == model.config.image_token_id).unsqueeze(-1)
        feats = image_features(model, batch.pixel_values)
        embeds = embeds.masked_scatter(is_image, feats.reshape(-1, feats.shape[-1]))
        out = inner.language_model(inputs_embeds=embeds, attention_mask=batch.attention_mask, output_hidden_states=True)
        logits = model.lm_head(out.hidden_states[-1])
        for r, (scene, qa) in enumerate(chunk):
            _, start, end = batch.qtypes[r][0]
            for layer, hidden in enumerate(out.hidden_states):
                residuals[layer].append(hidden[r, start - 1].numpy())
            predicted = logits[r, start - 1:end - 1].argmax(-1)
            correct.append(bool((predicted == batch.input_ids[r, start:end]).all()))
            centres = scenes.centroids(scene.masks[0], len(scene.objects[0]))
            places.append((*centres[qa.about], *centres[qa.ref]))
            yes.append(qa.answer == "Yes.")
    return Probed([np.array(r, dtype=np.float64) for r in residuals], np.array(places), np.array(yes),
                   np.array(correct))


def ridge_fit_predict(train_x, train_y, test_x, lam: float) -> np.ndarray:
    mean = train_x.mean(0)
    a, b = train_x - mean, test_x - mean
    w = np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]), a.T @ (train_y - train_y.mean()))
    return b @ w + train_y.mean()


def r_squared(predicted: np.ndarray, actual: np.ndarray) -> float:
    return float(1 - ((predicted - actual) ** 2).sum() / ((actual - actual.mean()) ** 2).sum())


def report(p: Probed) -> list[str]:
    split = int(0.7 * len(p.yes))
    lines = [f"{len(p.yes)} yes/no relations, {p.yes.mean():.0%} Yes; the model answers {p.correct.mean():.1%} "
             "right (teacher-forced)", "after layer | " + " | ".join(f"R² {c}" for c in COLUMNS) + " | answer probe"]
    for layer, x in enumerate(p.residuals):
        r2 = [max(r_squared(ridge_fit_predict(x[:split], p.places[:split, j], x[split:], lam), p.places[split:, j])
                  for lam in LAMBDAS) for j in range(4)]
        answer = max(float(((ridge_fit_predict(x[:split], p.yes[:split].astype(float), x[split:], lam) > 0.5)
                            == p.yes[split:]).mean()) for lam in LAMBDAS)
        name = "embeddings" if layer == 0 else str(layer - 1)
        lines.append(f"{name} | " + " | ".join(f"{v:.2f}" for v in r2) + f" | {answer:.1%}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(BUILTIN_MODEL_DIR))
    ap.add_argument("--n", type=int, default=800)
    ap.add_argument("--seed", type=int, default=4242)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = LlavaForConditionalGeneration.from_pretrained(args.model).eval()
    tokenizer = load_tokenizer(Path(args.model))
    grid = model.config.vision_config.image_size // model.config.vision_config.patch_size
    maker = BatchMaker(tokenizer, build_image_processor(model.config.vision_config.image_size), 0, grid)
    print("\n".join(report(probe_inputs(model, maker, yes_no_relations(args.n, args.seed)))))


if __name__ == "__main__":
    main()
