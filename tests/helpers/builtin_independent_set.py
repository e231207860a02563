"""An independent test set for the built-in model: pictures drawn by this file's own rasteriser
(numpy half-planes and distances, 3x supersampled, nothing from vlserve.builtin.scenes), questions
phrased its own way, and its own scoring (keywords in the answer, not the training references).

It stands for the pictures a new user draws: shapes anywhere and of any size, the cases issue 21
found wrong (one centred triangle, two shapes side by side, one large circle across the middle),
wide and tall pictures, videos moving any way, pictures with no shape at all, and real photographs.

    python tests/helpers/builtin_independent_set.py [MODEL_DIR]     # prints per-type accuracy
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

# Shades of their own (not the generator's), each still plainly the named colour.
PAINT = {"red": (205, 25, 45), "green": (40, 160, 70), "blue": (30, 90, 220), "yellow": (250, 210, 40),
         "orange": (240, 120, 30), "purple": (130, 40, 170)}
GROUNDS = [(255, 255, 255), (240, 240, 235), (110, 110, 110), (30, 30, 35)]
KINDS = ("circle", "square", "triangle")
WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}
SS = 3  # supersampling factor


@dataclass
class Figure:
    kind: str
    colour: str
    x: float  # centre, fraction of the visible square
    y: float
    r: float  # half-size, fraction of the visible square


@dataclass
class Item:
    images: list[Image.Image]
    question: str
    qtype: str
    check: object  # callable(answer) -> bool
    note: str = ""


def _inside(f: Figure, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    dx, dy = xs - f.x, ys - f.y
    if f.kind == "circle":
        return dx * dx + dy * dy <= f.r * f.r
    if f.kind == "square":
        return (np.abs(dx) <= f.r) & (np.abs(dy) <= f.r)
    # triangle, apex up: below the two slanted edges and above the base
    return (dy <= f.r) & (dy >= -f.r + 2 * np.abs(dx))


def paint(figures: list[Figure], size=(240, 240), ground=(255, 255, 255), move=None) -> Image.Image:
    """Figures over a plain ground; the visible square is the picture's central square."""
    w, h = size
    side = min(w, h)
    W, H = w * SS, h * SS
    ys, xs = np.mgrid[0:H, 0:W].astype(np.float32)
    u = (xs + 0.5 - (W - side * SS) / 2) / (side * SS)
    v = (ys + 0.5 - (H - side * SS) / 2) / (side * SS)
    img = np.empty((H, W, 3), dtype=np.float32)
    img[:] = ground
    for f in figures:
        img[_inside(f, u, v)] = PAINT[f.colour]
    small = img.reshape(h, SS, w, SS, 3).mean(axis=(1, 3))
    return Image.fromarray(small.round().astype(np.uint8))


# ---------------------------------------------------------------- scoring


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower().replace("color", "colour"))


def says_only(expected: str, vocabulary) -> object:
    def check(answer: str) -> bool:
        found = {w for w in _words(answer) if w in vocabulary}
        return found == {expected}
    return check


def says_number(n: int) -> object:
    numbers = {"zero": 0, "none": 0, "no": 0, **{w: k for k, w in WORDS.items()}, **{str(k): k for k in range(10)}}

    def check(answer: str) -> bool:
        said = [numbers[w] for w in _words(answer) if w in numbers]
        return said == [n]
    return check


def says_place(horizontal: str | None, vertical: str | None) -> object:
    def check(answer: str) -> bool:
        ws = set(_words(answer))
        sides = ws & {"left", "right"}
        levels = ws & {"top", "bottom"}
        middle = bool(ws & {"centre", "middle"})
        ok_h = sides == {horizontal} if horizontal in ("left", "right") else not sides
        ok_v = levels == {vertical} if vertical in ("top", "bottom") else not levels
        wants_middle = horizontal == "centre" and vertical in (None, "centre")
        return ok_h and ok_v and (middle or not wants_middle)
    return check


def says_yes(yes: bool) -> object:
    return lambda answer: (_words(answer)[:1] or [""])[0] == ("yes" if yes else "no")


def lists_figures(figures: list[Figure]) -> object:
    want = Counter((f.colour, f.kind) for f in figures)
    pattern = re.compile(r"\b(?:(a|an|one|two|three|four)\s+)?(" + "|".join(PAINT) + r")\s+("
                         + "|".join(KINDS) + r")s?\b")

    def check(answer: str) -> bool:
        got: Counter = Counter()
        for number, colour, kind in pattern.findall(answer.lower()):
            got[(colour, kind)] += {"two": 2, "three": 3, "four": 4}.get(number, 1)
        return got == want
    return check


def declines(answer: str) -> bool:
    a = answer.lower()
    return "only see" in a or "cannot" in a or "can't" in a


# ---------------------------------------------------------------- the set


def _layout(rng: np.random.Generator, n: int) -> list[Figure]:
    """n figures, none touching another, all inside the visible square."""
    while True:
        figs = []
        for _ in range(n):
            r = rng.uniform(0.08, 0.36 if n == 1 else 0.2)
            figs.append(Figure(str(rng.choice(KINDS)), "", rng.uniform(r + 0.03, 0.97 - r),
                               rng.uniform(r + 0.03, 0.97 - r), r))
        if all(np.hypot(a.x - b.x, a.y - b.y) > 1.5 * (a.r + b.r) for i, a in enumerate(figs) for b in figs[i + 1:]):
            for f, c in zip(figs, rng.choice(list(PAINT), n, replace=False)):
                f.colour = str(c)
            return figs


def _side(x: float) -> str | None:
    return "left" if x < 0.32 else "right" if x > 0.68 else "centre" if 0.44 < x < 0.56 else None


def issue_cases() -> list[Item]:
    """The pictures issue 21 reported answered wrong."""
    triangle = [Figure("triangle", "green", 0.5, 0.5, 0.22)]
    pair = [Figure("square", "red", 0.27, 0.5, 0.15), Figure("circle", "blue", 0.73, 0.5, 0.15)]
    big = [Figure("circle", "red", 0.5, 0.5, 0.42)]
    return [
        Item([paint(triangle)], "How many shapes are in this picture?", "count", says_number(1), "centred triangle"),
        Item([paint(pair)], "How many shapes are there in the image?", "count", says_number(2), "side by side"),
        Item([paint(big)], "Describe this picture.", "caption", lists_figures(big), "one large circle"),
        Item([paint(big)], "How many circles do you see?", "count", says_number(1)),  # not in the issue
        Item([paint(pair)], "Is the blue circle on the left or right side?", "position", says_place("right", None),
             "side by side"),
    ]


def build(seed: int = 4242, per_type: int = 16) -> list[Item]:
    rng = np.random.default_rng(seed)
    items = issue_cases()
    sizes = [(240, 240), (320, 200), (200, 300), (160, 160)]

    def picture(figs):
        return paint(figs, sizes[int(rng.integers(len(sizes)))], GROUNDS[int(rng.integers(len(GROUNDS)))])

    colours, kinds = set(PAINT), set(KINDS)
    for i in range(per_type):
        figs = _layout(rng, int(rng.integers(1, 5)))
        img = picture(figs)
        f = figs[int(rng.integers(len(figs)))]
        unique_kind = sum(g.kind == f.kind for g in figs) == 1
        if unique_kind:
            items.append(Item([img], f"Could you tell me the colour of the {f.kind}?", "colour",
                              says_only(f.colour, colours)))
        items.append(Item([img], f"What is the shape of the {f.colour} thing?" if i % 2 else
                          f"Which shape has the colour {f.colour}?", "shape", says_only(f.kind, kinds)))
        n_kind = sum(g.kind == KINDS[i % 3] for g in figs)
        items.append(Item([img], "How many shapes can be seen here?" if i % 2 else
                          f"How many {KINDS[i % 3]}s are in the image?",
                          "count", says_number(len(figs)) if i % 2 else says_number(n_kind)))
        h = _side(f.x)
        if h in ("left", "right"):
            items.append(Item([img], f"On which side is the {f.colour} {f.kind}, left or right?", "position",
                              says_place(h, None)))
        present = i % 2 == 0
        ask = f if present else Figure(f.kind, next(c for c in PAINT
                                                    if all((c, f.kind) != (g.colour, g.kind) for g in figs)), 0, 0, 0)
        items.append(Item([img], f"Is there a {ask.colour} {ask.kind} in this image?", "yes/no", says_yes(present)))
        if i % 2 == 0:
            items.append(Item([img], "Please describe the picture briefly.", "caption", lists_figures(figs)))

    for i in range(per_type // 2):  # videos: one figure sliding in one of eight directions
        dx, dy = [(-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (1, -1), (-1, 1), (1, 1)][i % 8]
        colour, kind = str(rng.choice(list(PAINT))), str(rng.choice(KINDS))
        steps = 6
        frames = []
        for t in range(steps):
            p = 0.25 + 0.5 * t / (steps - 1)
            x = 0.5 if dx == 0 else (p if dx > 0 else 1 - p)
            y = 0.5 if dy == 0 else (p if dy > 0 else 1 - p)
            frames.append(paint([Figure(kind, colour, x, y, 0.14)], (200, 200), GROUNDS[i % len(GROUNDS)]))
        horizontal = {-1: "left", 1: "right", 0: None}[dx]
        vertical = {-1: "up", 1: "down", 0: None}[dy]

        def moved(answer: str, horizontal=horizontal, vertical=vertical) -> bool:
            ws = set(_words(answer))
            return ws & {"left", "right"} == ({horizontal} if horizontal else set()) and \
                ws & {"up", "down"} == ({vertical} if vertical else set())
        items.append(Item(frames, f"In what direction is the {kind} travelling?", "video direction", moved))

    for i in range(per_type // 2):  # no known shape: a photograph-like scene, static, a flat fill
        w, h = sizes[i % len(sizes)]
        yy, xx = np.mgrid[0:h, 0:w] / max(w, h)
        if i % 3 == 0:  # sky over ground with soft blobs
            sky = np.stack([120 + 80 * yy, 170 + 50 * yy, 230 - 30 * yy], -1)
            ground = np.stack([60 + 40 * np.sin(9 * xx), 110 + 30 * np.cos(7 * xx + 3 * yy), 40 + 0 * xx], -1)
            arr = np.where((yy > 0.45 + 0.05 * np.sin(6 * xx))[..., None], ground, sky)
        elif i % 3 == 1:
            arr = rng.normal(128, 60, (h, w, 3))
        else:
            arr = np.ones((h, w, 3)) * rng.uniform(0, 255, 3)
        img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
        q = ["What colour is the square?", "How many circles are there?", "What shape do you see?",
             "Describe the picture."][i % 4]
        items.append(Item([img], q, "no known shape", declines))

    questions = ["What colour is the circle?", "How many shapes are there?", "Where is the triangle?",
                 "What do you see in this picture?"]
    for i, photo in enumerate(photographs()):
        for q in questions[i % 2::2]:
            items.append(Item([photo], q, "photograph", declines))
    return items


def photographs() -> list[Image.Image]:
    """A real photograph (matplotlib's sample portrait of Grace Hopper), whole and three crops: the
    face, the flag behind her, the uniform."""
    from matplotlib import cbook

    with Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)) as im:
        photo = im.convert("RGB")
    return [photo] + [photo.crop(box) for box in ((150, 40, 420, 310), (0, 0, 150, 250), (80, 340, 512, 600))]


@dataclass
class Score:
    right: Counter = field(default_factory=Counter)
    total: Counter = field(default_factory=Counter)
    wrong: list = field(default_factory=list)

    def accuracy(self, qtype: str | None = None) -> float:
        if qtype is None:
            return sum(self.right.values()) / sum(self.total.values())
        return self.right[qtype] / self.total[qtype]


def score(items: list[Item], answers: list[str]) -> Score:
    s = Score()
    for item, answer in zip(items, answers):
        s.total[item.qtype] += 1
        if item.check(answer):
            s.right[item.qtype] += 1
        else:
            s.wrong.append((item.qtype, item.question, answer, item.note))
    return s


def ask_engine(engine, items: list[Item]) -> list[str]:
    tok = engine.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": [{"type": "image"}] * len(it.images)
                                         + [{"type": "text", "text": it.question}]}],
                                       tokenize=False, add_generation_prompt=True) for it in items]
    outs = engine.generate(prompt=prompts, image_data=[it.images for it in items],
                           sampling_params={"max_new_tokens": 32, "temperature": 0})
    return [o["text"] for o in outs]


if __name__ == "__main__":
    import sys

    from vlserve import Engine

    kwargs = {"model": sys.argv[1]} if len(sys.argv) > 1 else {}
    with Engine(max_total_tokens=32768, **kwargs) as engine:
        items = build()
        result = score(items, ask_engine(engine, items))
    for qtype in result.total:
        print(f"{qtype:<16} {result.accuracy(qtype):>7.1%} {result.total[qtype]:>4}")
    print(f"{'overall':<16} {result.accuracy():>7.1%} {sum(result.total.values()):>4}")
    for w in result.wrong:
        print("wrong:", w)
