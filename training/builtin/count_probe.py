"""Does the model count shapes, or colours? "How many shapes are there?" about crowded pictures.

    python -m training.builtin.count_probe [--model DIR] [--n 400] [--seed 7]

typed.py's crowded pictures of three to six shapes (each keeping CROWDED_VISIBLE of itself, on any
listed canvas), half with a different colour for every shape and half with colours drawn with repeats.
The report gives the accuracy for each number of shapes, split by whether colours repeat, and the
commonest wrong answers. A model that counts colours is right when they differ and says fewer when
they repeat (two touching red shapes read as one).
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from dataclasses import dataclass

from PIL import Image

from training.builtin import evaluate
from vlserve.builtin import scenes, typed
from vlserve.model.builtin import BUILTIN_MODEL_DIR

COUNTS = (3, 4, 5, 6)
QUESTION = "How many shapes are there?"


@dataclass(frozen=True)
class CountItem:
    image: Image.Image
    shapes: tuple[scenes.Shape, ...]

    @property
    def count(self) -> int:
        return len(self.shapes)

    @property
    def colours_repeat(self) -> bool:  # two shapes or more share a colour
        return len({s.colour for s in self.shapes}) < len(self.shapes)


def crowded(rng: random.Random, n: int, colours_repeat: bool) -> list[scenes.Shape]:
    """n shapes as typed.py crowds them, with a colour shared (or none) as asked."""
    while True:
        shapes, _ = typed.crowded_shapes(rng, (n,), repeat_share=float(colours_repeat))
        if (len({s.colour for s in shapes}) < n) == colours_repeat:
            return shapes


def draw(n: int, seed: int) -> list[CountItem]:
    """n crowded pictures, the same number for each count and for distinct and repeated colours."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        count, colours_repeat = COUNTS[i % len(COUNTS)], bool(i // len(COUNTS) % 2)
        shapes = crowded(rng, count, colours_repeat)
        view = scenes.View(*rng.choice(scenes.PICTURE_SIZES + typed.EXTRA_SIZES))
        background = rng.choice(scenes.BACKGROUND_KINDS), rng.choice(list(scenes.BACKGROUNDS))
        out.append(CountItem(scenes.render(shapes, view, *background, rng), tuple(shapes)))
    return out


def report(items: list[CountItem], answers: list[str]) -> str:
    right, total, wrong = Counter(), Counter(), Counter()
    for item, answer in zip(items, answers):
        key = (item.count, item.colours_repeat)
        total[key] += 1
        if answer.strip() == scenes.count_word(item.count):
            right[key] += 1
        else:
            wrong[(item.count, answer.strip())] += 1
    lines = ["shapes  colours differ   colours repeat"]
    for n in COUNTS:
        cells = [f"{right[n, r]:>4}/{total[n, r]:<4} {right[n, r] / max(total[n, r], 1):6.1%}" for r in (False, True)]
        lines.append(f"{n:>6}  " + "  ".join(cells))
    lines.append("commonest misses: " + ", ".join(f"{n} called {a!r} ×{c}" for (n, a), c in wrong.most_common(6)))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(BUILTIN_MODEL_DIR))
    p.add_argument("--n", type=int, default=400)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()
    items = draw(a.n, a.seed)
    generate, tokenizer = evaluate.transformers_backend(a.model)
    answers = generate([evaluate.prompt_for(QUESTION, 1, tokenizer)] * len(items), [[it.image] for it in items])
    print(f"model {a.model}  {a.n} crowded pictures, seed {a.seed}: {QUESTION!r}")
    print(report(items, answers))


if __name__ == "__main__":
    main()
