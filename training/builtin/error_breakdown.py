"""Where the built-in model's counts and captions go wrong: accuracy split by the number of shapes, the
smallest shape's size and whether one shape covers part of another.

    python -m training.builtin.error_breakdown --model DIR --questions 600 --seed 777 [--show-wrong]

Each scene drawn by the training generator (with a held-out seed) is asked one of its count and one
of its caption questions, through transformers; the table is what chose run 6's 96-px input.
"""

import argparse
import random
from collections import defaultdict
from dataclasses import dataclass

import torch

from training.builtin import evaluate
from vlserve.builtin import scenes

SMALL = 0.25  # a shape whose bounding square is under this share of the view's side
OVERLAP = 0.98  # a shape with less than this share of its own mask visible is partly covered


@dataclass
class Case:
    scene: scenes.Scene
    qa: scenes.QA
    shapes: int
    smallest: float  # the smallest shape's size (side of its bounding square / the view's side)
    least_visible: float  # the smallest share of a shape's own mask left visible


def visible_share(scene: scenes.Scene, k: int) -> float:
    own = scenes.shape_mask(scene.objects[0][k]).sum()
    return float((scene.masks[0] == k + 1).sum() / max(1, own))


def draw_cases(n_questions: int, seed: int) -> list[Case]:
    rng, cases = random.Random(seed), []
    while len(cases) < n_questions:
        scene = scenes.image_scene(rng)
        shapes = scene.objects[0]
        for qtype in ("count", "caption"):
            asked = [q for q in scene.qas if q.qtype == qtype]
            if asked:
                cases.append(Case(scene, rng.choice(asked), len(shapes), min(s.size for s in shapes),
                                  min(visible_share(scene, k) for k in range(len(shapes)))))
    return cases


def groups(case: Case) -> list[str]:
    return ["all", f"{case.shapes} shapes",
            f"smallest < {SMALL}" if case.smallest < SMALL else f"smallest >= {SMALL}",
            "overlapping" if case.least_visible < OVERLAP else "apart"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(evaluate.DEFAULT_MODEL))
    p.add_argument("--questions", type=int, default=600, help="count and caption questions in all")
    p.add_argument("--seed", type=int, default=777)
    p.add_argument("--show-wrong", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    generate, tokenizer = evaluate.transformers_backend(a.model)
    cases = draw_cases(a.questions, a.seed)
    answers = generate([evaluate.prompt_for(c.qa.question, 1, tokenizer) for c in cases],
                       [c.scene.frames for c in cases])
    tally = defaultdict(lambda: [0, 0])
    for case, answer in zip(cases, answers):
        right = evaluate.is_correct(case.qa.qtype, answer, case.qa.answer)
        for group in groups(case):
            tally[case.qa.qtype, group][0] += right
            tally[case.qa.qtype, group][1] += 1
        if not right and a.show_wrong:
            print(f"{case.qa.qtype} {case.shapes} shapes, smallest {case.smallest:.2f}: "
                  f"{case.qa.question!r} -> {answer!r} (reference {case.qa.answer!r})")
    print(f"model {a.model}  seed {a.seed}")
    for (qtype, group), (right, total) in sorted(tally.items()):
        print(f"{qtype:8} {group:16} {right / total:6.1%} {total:4}")


if __name__ == "__main__":
    main()
