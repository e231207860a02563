"""How the independent set's "biggest" / "smallest" questions fare by how plainly the sizes differ:
the answer's visible area over the next shape's, counted from the picture's pixels (each shape of a
relation picture has its own paint).

    python -m training.builtin.size_margin --model DIR --seeds 50 57
"""

from __future__ import annotations

import argparse

import numpy as np

from training.builtin import independent_set
from training.builtin.evaluate import prompt_for, transformers_backend

BANDS = ((1.0, 1.3), (1.3, 1.7), (1.7, 2.2), (2.2, float("inf")))


def area_ratio(item: independent_set.Item) -> float:
    """The largest visible area over the next one's for "biggest", the next over the smallest for "smallest"."""
    pixels = np.asarray(item.images[0]).reshape(-1, 3)
    areas = sorted(n for rgb in independent_set.PAINT.values() if (n := int((pixels == rgb).all(1).sum())))
    biggest = item.question in independent_set.BIGGEST_QS
    return areas[-1] / areas[-2] if biggest else areas[1] / areas[0]


def size_items(seeds: range) -> list[independent_set.Item]:
    asked = set(independent_set.BIGGEST_QS + independent_set.SMALLEST_QS)
    return [it for seed in seeds for it in independent_set.build(seed) if it.question in asked]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--seeds", type=int, nargs=2, default=(50, 57), metavar=("FIRST", "LAST"))
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    generate, tokenizer = transformers_backend(a.model)
    items = size_items(range(a.seeds[0], a.seeds[1] + 1))
    answers = generate([prompt_for(it.question, 1, tokenizer) for it in items], [it.images for it in items])
    rows = [(area_ratio(it), independent_set.is_right(it, ans), it.question in independent_set.BIGGEST_QS)
            for it, ans in zip(items, answers)]
    print(f"model {a.model}  independent-set seeds {a.seeds[0]}-{a.seeds[1]}: {len(rows)} size questions")
    print("area ratio      right   biggest  smallest")
    for lo, hi in BANDS:
        band = [r for r in rows if lo <= r[0] < hi]
        cells = [_tally(band), _tally([r for r in band if r[2]]), _tally([r for r in band if not r[2]])]
        print(f"{lo:.1f}-{hi:<8.1f} " + " ".join(cells))


def _tally(rows: list[tuple[float, bool, bool]]) -> str:
    return f"{sum(r[1] for r in rows):4d}/{len(rows):<4d}"


if __name__ == "__main__":
    main()
