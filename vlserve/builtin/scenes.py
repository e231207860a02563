"""Synthetic scenes for the built-in model: what people draw, with questions and short answers.

Everything is drawn from a `random.Random(seed)`, so a seed fixes every pixel, question and answer.
An image scene has one to four circles, squares and triangles anywhere in the picture, from small to
filling the frame, overlapping a little at most, on a plain, gradient or textured background, in a
picture of one of several sizes and aspect ratios. The model's image processor resizes the short
side and centre-crops a square (CLIP's processing), so shapes are placed inside that visible square
and every answer (count, position, caption) is read from the shapes' own label mask of the view.

A video scene is 4-8 frames of one shape that moves in one of eight directions, changes colour,
appears or disappears. An out-of-world scene (noise, a photograph-like texture or clutter, a blank
picture) has no known shape, and every question about it is answered with `CANNOT_TELL`.

Each scene keeps a label mask of the model's view per frame (0 = background, k = k-th object), which
training uses for its per-patch targets; serving never sees it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

SHAPES = ("circle", "square", "triangle")
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (40, 70, 230),
    "yellow": (240, 220, 30),
    "orange": (245, 140, 20),
    "purple": (140, 50, 190),
}
# Neutral tones only, so a background is never mistaken for a shape's colour.
BACKGROUNDS = {"white": (250, 250, 250), "black": (15, 15, 15), "gray": (128, 128, 128),
               "light gray": (200, 200, 200), "beige": (235, 225, 200), "dark gray": (60, 60, 60)}
BACKGROUND_KINDS = ("plain", "gradient", "textured")
PICTURE_SIZES = ((128, 128), (96, 96), (200, 200), (160, 120), (120, 160), (192, 108), (108, 192),
                 (150, 100), (100, 150))  # width, height
DIRECTIONS = {  # answer -> (dx, dy) in the view (y down)
    "left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1),
    "up and to the left": (-1, -1), "up and to the right": (1, -1),
    "down and to the left": (-1, 1), "down and to the right": (1, 1),
}
VIDEO_KINDS = ("move", "recolour", "appear", "disappear")
OUTSIDE_KINDS = ("noise", "photo", "blank")

IMAGE_QTYPES = ("colour", "shape", "count", "position", "exists", "caption")
VIDEO_QTYPES = ("direction", "first_colour", "last_colour", "appears", "event")
OUTSIDE_QTYPE = "outside"
CANNOT_TELL = "I can only see circles, squares and triangles."

CANVAS = 128  # side of the label masks: the model's view (the processor's crop), resampled to the patch grid
NUMBER_WORDS = {0: "none", 1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}  # typed.py draws 5-6
MIN_VISIBLE = 0.7  # a shape partly covered by a later one keeps at least this share of its area


@dataclass(frozen=True)
class Shape:
    shape: str
    colour: str
    cx: float  # centre, as a fraction of the view's side
    cy: float
    size: float  # side of the bounding square, as a fraction of the view's side


@dataclass
class QA:
    question: str
    answer: str
    qtype: str
    about: int | None = None  # index (in the frame's objects) of the shape the question names
    ref: int | None = None  # of a relation: the shape it is measured from ("above the square": the square)


@dataclass
class Scene:
    """A drawn image (one frame) or video (4-8 frames) with every question it can answer."""

    frames: list[Image.Image]
    masks: list[np.ndarray]  # per frame, uint8 (CANVAS, CANVAS) over the view: 0 background, k = objects[k-1]
    objects: list[list[Shape]]  # per frame, the shapes drawn in it
    background: str
    qas: list[QA]

    @property
    def is_video(self) -> bool:
        return len(self.frames) > 1


@dataclass
class Sample:
    """One question about one image or video; `images` holds 1 image or the 4-8 frames of a video
    (behind the pictures of any worked examples in `shots`: (images, question, answer) a turn)."""

    images: list[Image.Image]
    question: str
    answer: str
    qtype: str
    shots: list[tuple[int, str, str]] = field(default_factory=list)


# ---------------------------------------------------------------- drawing


@dataclass(frozen=True)
class View:
    """Where the processor's centre crop sits in a picture of `width` x `height` pixels."""

    width: int
    height: int

    @property
    def side(self) -> int:
        return min(self.width, self.height)

    def to_pixels(self, u: float, v: float) -> tuple[float, float]:
        return (self.width - self.side) / 2 + u * self.side, (self.height - self.side) / 2 + v * self.side


def _jitter(rgb, rng: random.Random, amount: int = 18) -> tuple[int, int, int]:
    return tuple(max(0, min(255, c + rng.randint(-amount, amount))) for c in rgb)


def _outline(s: Shape, side: float, origin=(0.0, 0.0)) -> tuple[str, list[float] | list[tuple[float, float]]]:
    """("ellipse" | "rectangle" | "polygon", coordinates) of a shape in a square of `side` pixels."""
    cx, cy, h = origin[0] + s.cx * side, origin[1] + s.cy * side, s.size * side / 2
    if s.shape == "circle":
        return "ellipse", [cx - h, cy - h, cx + h, cy + h]
    if s.shape == "square":
        return "rectangle", [cx - h, cy - h, cx + h, cy + h]
    return "polygon", [(cx, cy - h), (cx + h, cy + h), (cx - h, cy + h)]


def _draw(draw: ImageDraw.ImageDraw, s: Shape, side: float, fill, origin=(0.0, 0.0), edge=None, width=0) -> None:
    kind, xy = _outline(s, side, origin)
    getattr(draw, kind)(xy, fill=fill, outline=edge, width=width)


def shape_mask(s: Shape) -> np.ndarray:
    """The shape alone on the view's label canvas."""
    m = Image.new("L", (CANVAS, CANVAS), 0)
    _draw(ImageDraw.Draw(m), s, CANVAS, 1)
    return np.asarray(m, dtype=bool)


def label_mask(shapes: list[Shape]) -> np.ndarray:
    mask = np.zeros((CANVAS, CANVAS), dtype=np.uint8)
    for k, s in enumerate(shapes, start=1):
        mask[shape_mask(s)] = k  # later shapes are drawn on top
    return mask


def background(view: View, kind: str, name: str, rng: random.Random) -> Image.Image:
    base = np.array(_jitter(BACKGROUNDS[name], rng, 10), dtype=np.float32)
    h, w = view.height, view.width
    if kind == "plain":
        arr = np.broadcast_to(base, (h, w, 3)).copy()
    elif kind == "gradient":
        other = np.array(_jitter(BACKGROUNDS[rng.choice(list(BACKGROUNDS))], rng, 10), dtype=np.float32)
        angle = rng.uniform(0, 2 * np.pi)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        t = (np.cos(angle) * xx / w + np.sin(angle) * yy / h)
        t = (t - t.min()) / max(1e-6, float(t.max() - t.min()))
        arr = base * (1 - t[..., None]) + other * t[..., None]
    else:  # textured: low-contrast grey noise, stripes or checks
        np_rng = np.random.default_rng(rng.getrandbits(32))
        style = rng.choice(("noise", "stripes", "checks"))
        yy, xx = np.mgrid[0:h, 0:w]
        if style == "noise":
            pattern = np_rng.normal(0, 1, (h, w))
        elif style == "stripes":
            period = rng.randint(4, 14)
            pattern = np.where(((xx + yy * rng.choice((0, 1))) // period) % 2 == 0, 1.0, -1.0)
        else:
            period = rng.randint(4, 14)
            pattern = np.where(((xx // period) + (yy // period)) % 2 == 0, 1.0, -1.0)
        arr = base + rng.uniform(6, 20) * pattern[..., None]
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def render(shapes: list[Shape], view: View, bg_kind: str, bg_name: str, rng: random.Random) -> Image.Image:
    img = background(view, bg_kind, bg_name, rng)
    d = ImageDraw.Draw(img)
    origin = view.to_pixels(0, 0)
    for s in shapes:
        fill = _jitter(COLOURS[s.colour], rng)
        if rng.random() < 0.25:  # an outline in a darker tone, as drawing tools add
            edge = tuple(int(c * 0.6) for c in fill)
            _draw(d, s, view.side, fill, origin, edge, max(1, round(view.side / 60)))
        else:
            _draw(d, s, view.side, fill, origin)
    return img


def patch_blocks(mask: np.ndarray, grid: int) -> np.ndarray:
    """A label mask cut into the model's grid x grid patches: [grid * grid, pixels per patch],
    patches in row-major order (the order of the image tokens)."""
    block = -(-CANVAS // grid)
    if block * grid != CANVAS:  # a grid that does not divide the canvas: nearest-neighbour resample
        pick = np.arange(block * grid) * CANVAS // (block * grid)
        mask = mask[np.ix_(pick, pick)]
    return mask.reshape(grid, block, grid, block).transpose(0, 2, 1, 3).reshape(grid * grid, -1)


def centroids(mask: np.ndarray, n: int) -> list[tuple[float, float]]:
    """Visible centre (x, y) of objects 1..n as fractions of the view."""
    out = []
    for k in range(1, n + 1):
        ys, xs = np.nonzero(mask == k)
        out.append(((xs.mean() + 0.5) / CANVAS, (ys.mean() + 0.5) / CANVAS))
    return out


# ---------------------------------------------------------------- positions and phrases


def horizontal(x: float) -> str | None:
    """left / centre / right, or None in the gaps between them (no single answer there)."""
    return "left" if x < 0.37 else "right" if x > 0.63 else "centre" if 0.42 < x < 0.58 else None


def vertical(y: float) -> str | None:
    return "top" if y < 0.37 else "bottom" if y > 0.63 else "centre" if 0.42 < y < 0.58 else None


def where_phrase(h: str, v: str) -> str:
    if h == "centre" and v == "centre":
        return "In the centre."
    if v == "centre":
        return f"On the {h}."
    if h == "centre":
        return f"At the {v}."
    return f"At the {v} {h}."


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _join(phrases: list[str]) -> str:
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + " and " + phrases[-1]


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def caption_groups(shapes: list[Shape], centres: list[tuple[float, float]]) -> list[tuple[str, str, list[int]]]:
    """(colour, shape, object indices) per kind of shape, in the fixed order of COLOURS, then SHAPES
    (objects of one kind left to right).

    The order is the vocabulary's, not the picture's: the next phrase of a caption is then "the
    first colour after the one just written that the picture has", which one attention step over
    the per-patch colour features answers. Left to right, the model had to find the last-named
    shape's column again before it could look right of it, and it named one shape twice ("a red
    circle, a red circle") in about a third of the multi-shape captions."""
    groups: dict[tuple[str, str], list[int]] = {}
    for k in sorted(range(len(shapes)), key=lambda k: centres[k][0]):
        groups.setdefault((shapes[k].colour, shapes[k].shape), []).append(k)
    colour_rank, shape_rank = list(COLOURS), list(SHAPES)
    kinds = sorted(groups, key=lambda cs: (colour_rank.index(cs[0]), shape_rank.index(cs[1])))
    return [(c, s, groups[(c, s)]) for c, s in kinds]


def caption_of(shapes: list[Shape], centres: list[tuple[float, float]]) -> str:
    named = []
    for colour, shape, ks in caption_groups(shapes, centres):
        named.append(f"{_article(colour)} {colour} {shape}" if len(ks) == 1
                     else f"{NUMBER_WORDS[len(ks)]} {colour} {shape}s")
    return _cap(_join(named)) + "."


def count_word(n: int) -> str:
    return _cap(NUMBER_WORDS[n]) + "."


# ---------------------------------------------------------------- image scenes


def _colour_q(noun: str, rng: random.Random) -> str:
    return rng.choice([
        f"What colour is the {noun}?", f"What color is the {noun}?", f"Which colour is the {noun}?",
        f"Tell me the colour of the {noun}.", f"What is the color of the {noun}?", f"The {noun} is what colour?",
        f"Can you tell me what colour the {noun} is?", f"What's the colour of the {noun}?",
        f"What colour does the {noun} have?", f"Please tell me the color of the {noun}.",
        f"Which color is the {noun} in this picture?", f"What colour is the {noun} here?",
    ])


def _shape_by_colour_qs(colour: str, rng: random.Random) -> list[str]:
    """Shape questions with the word "colour" (or "color") beside the colour's name, so that the word
    alone does not make a question about colour: the previous checkpoint answered a phrasing of
    this kind that it had never seen ("Which shape has the colour yellow?") with "Yellow."."""
    word = rng.choice(("colour", "color"))
    return [f"What shape is in the {word} {colour}?", f"Which shape is of the {word} {colour}?",
            f"Which shape comes in {colour} {word}?", f"What shape is drawn in the {word} {colour}?",
            f"Which shape's {word} is {colour}?", f"Which one of the shapes is in {colour} {word}?"]


def _image_qas(shapes: list[Shape], centres, rng: random.Random) -> list[QA]:
    qas: list[QA] = []
    n = len(shapes)
    by_shape = {name: [k for k, s in enumerate(shapes) if s.shape == name] for name in SHAPES}
    by_colour = {c: [k for k, s in enumerate(shapes) if s.colour == c] for c in COLOURS}
    pairs = {(s.colour, s.shape) for s in shapes}

    for k, s in enumerate(shapes):
        if len(by_shape[s.shape]) == 1:
            noun = "shape" if n == 1 and rng.random() < 0.4 else s.shape
            qas.append(QA(_colour_q(noun, rng), f"{_cap(s.colour)}.", "colour", about=k))
        if len(by_colour[s.colour]) == 1:
            if n == 1 and rng.random() < 0.4:
                q = rng.choice(["What shape is it?", "What shape is in the picture?", "Which shape do you see?",
                                "What is this shape?", "What shape can you see here?", "Which shape is this?",
                                "What's the shape in this image?"])
            else:
                noun = rng.choice(("object", "shape", "thing", "one", "figure"))
                q = rng.choice([f"What shape is the {s.colour} {noun}?", f"Which shape is {s.colour}?",
                                f"What kind of shape is the {s.colour} one?", f"Name the {s.colour} shape.",
                                f"What is the {s.colour} shape?", f"What is the shape of the {s.colour} {noun}?",
                                f"Which shape is coloured {s.colour}?", f"Which of the shapes is {s.colour}?",
                                f"The {s.colour} {noun} is which shape?", f"Which shape has {s.colour} as its colour?",
                                *_shape_by_colour_qs(s.colour, rng)])
            qas.append(QA(q, f"{_cap(_article(s.shape))} {s.shape}.", "shape", about=k))
        matching = [t for t in shapes if (t.colour, t.shape) == (s.colour, s.shape)]
        who = f"{s.colour} {s.shape}" if len(matching) == 1 else None
        if who is None:
            continue
        h, v = horizontal(centres[k][0]), vertical(centres[k][1])
        options = []
        if h is not None and v is not None:
            options.append((rng.choice([f"Where is the {who}?", f"Where is the {who} in the picture?",
                                        f"Where can I find the {who}?", f"In which part of the image is the {who}?",
                                        f"Where's the {who} in this image?", f"Where is the {who} located?"]),
                            where_phrase(h, v)))
        if h in ("left", "right"):
            options.append((rng.choice([f"Is the {who} on the left or the right?",
                                        f"Is the {who} on the left side or the right side?",
                                        f"Which side is the {who} on, left or right?",
                                        f"Left or right: where is the {who}?",
                                        f"Is the {who} to the left or to the right?",
                                        f"On what side of the picture is the {who}, left or right?"]), f"On the {h}."))
        if v in ("top", "bottom"):
            options.append((rng.choice([f"Is the {who} at the top or the bottom?",
                                        f"Is the {who} in the top half or the bottom half?",
                                        f"Top or bottom: where is the {who}?",
                                        f"Is the {who} near the top or near the bottom?"]), f"At the {v}."))
        if options:
            q, a = rng.choice(options)
            qas.append(QA(q, a, "position", about=k))

    if rng.random() < 0.5:
        q = rng.choice(["How many shapes are there?", "How many shapes are in the image?", "Count the shapes.",
                        "How many objects can you see?", "How many shapes do you see?",
                        "What is the number of shapes?", "How many shapes can be seen?",
                        "How many shapes are there in this picture?", "How many things are in the image?",
                        "How many figures do you see here?", "Count the objects in the picture."])
        qas.append(QA(q, count_word(n), "count"))
    else:
        name = rng.choice(SHAPES)
        q = rng.choice([f"How many {name}s are there?", f"How many {name}s are in the picture?",
                        f"Count the {name}s.", f"How many {name}s can you see?",
                        f"How many {name}s are there in this image?", f"How many {name}s do you see here?",
                        f"What is the number of {name}s?"])
        qas.append(QA(q, count_word(len(by_shape[name])), "count"))

    # yes/no, half of them true
    if rng.random() < 0.5:
        k = rng.randrange(n)
        colour, shape = shapes[k].colour, shapes[k].shape
        answer, about = "Yes.", k
    else:
        absent = [(c, s) for c in COLOURS for s in SHAPES if (c, s) not in pairs]
        colour, shape = rng.choice(absent)
        answer, about = "No.", None
    form = rng.random()
    if form < 0.5:
        # People often write "a" before a vowel too ("a orange circle").
        art = "a" if rng.random() < 0.2 else _article(colour)
        q = rng.choice([f"Is there {art} {colour} {shape}?", f"Do you see {art} {colour} {shape}?",
                        f"Is there {art} {colour} {shape} in the picture?",
                        f"Is there {art} {colour} {shape} in this image?",
                        f"Does the picture contain {art} {colour} {shape}?", f"Can you find {art} {colour} {shape}?",
                        f"Is there {art} {colour} {shape} here?", f"Do you see {art} {colour} {shape} in the image?"])
    elif form < 0.75:
        present = bool(by_shape[shape])
        answer, about = ("Yes.", by_shape[shape][0]) if present else ("No.", None)
        q = rng.choice([f"Is there {_article(shape)} {shape}?", f"Are there any {shape}s?",
                        f"Can you see {_article(shape)} {shape}?"])
    else:
        present = bool(by_colour[colour])
        answer, about = ("Yes.", by_colour[colour][0]) if present else ("No.", None)
        q = rng.choice([f"Is there anything {colour}?", f"Is there {_article(colour)} {colour} shape?",
                        f"Do you see something {colour}?"])
    qas.append(QA(q, answer, "exists", about=about))

    q = rng.choice(["Describe the image in one sentence.", "What is in the image?",
                    "Write a short caption for this picture.", "Describe what you see.", "What do you see?",
                    "What is in this picture?", "Describe this image.",
                    "Describe the picture briefly.", "Give a short description of the image.",
                    "What can you see in this picture?", "Caption this image.", "Tell me what is in the picture.",
                    "Briefly describe the image."])
    qas.append(QA(q, caption_of(shapes, centres), "caption"))
    return qas


def _sizes(n: int, rng: random.Random) -> list[float]:
    top = {1: 0.92, 2: 0.6, 3: 0.48, 4: 0.42}[n]
    return [rng.uniform(0.16, top) for _ in range(n)]


def place_shapes(n: int, rng: random.Random, colours: list[str]) -> tuple[list[Shape], np.ndarray] | None:
    """n shapes anywhere in the view, each keeping MIN_VISIBLE of itself; None when no fit was found."""
    for _ in range(30):
        shapes = []
        for colour, size in zip(colours, _sizes(n, rng)):
            h = size / 2 + 0.02
            shapes.append(Shape(rng.choice(SHAPES), colour, rng.uniform(h, 1 - h), rng.uniform(h, 1 - h), size))
        mask = label_mask(shapes)
        if all((mask == k + 1).sum() >= MIN_VISIBLE * shape_mask(s).sum() for k, s in enumerate(shapes)):
            return shapes, mask
    return None


def _colours(n: int, rng: random.Random, repeat_share: float = 0.25) -> list[str]:
    """n colours: at `repeat_share`, each drawn alone (so a colour may repeat: "two red circles"), else n
    different ones."""
    if n > 1 and rng.random() < repeat_share:
        return [rng.choice(list(COLOURS)) for _ in range(n)]
    return rng.sample(list(COLOURS), n)


def image_scene(rng: random.Random) -> Scene:
    while True:
        n = rng.choice((1, 1, 2, 2, 3, 3, 4))
        placed = place_shapes(n, rng, _colours(n, rng))
        if placed is not None:
            break
    shapes, mask = placed
    view = View(*rng.choice(PICTURE_SIZES))
    bg_kind, bg_name = rng.choice(BACKGROUND_KINDS), rng.choice(list(BACKGROUNDS))
    img = render(shapes, view, bg_kind, bg_name, rng)
    centres = centroids(mask, n)
    return Scene([img], [mask], [shapes], bg_name, _image_qas(shapes, centres, rng))


# ---------------------------------------------------------------- out-of-world pictures


def outside_picture(kind: str, view: View, rng: random.Random) -> Image.Image:
    np_rng = np.random.default_rng(rng.getrandbits(32))
    h, w = view.height, view.width
    if kind == "noise":
        arr = np_rng.integers(0, 256, (h, w, 3))
        if rng.random() < 0.5:
            arr = np.repeat(arr[..., :1], 3, axis=2)
        return Image.fromarray(arr.astype(np.uint8))
    if kind == "blank":  # a known tone, or any colour at all
        rgb = (_jitter(rng.choice([*BACKGROUNDS.values(), *COLOURS.values()]), rng, 25) if rng.random() < 0.5
               else tuple(rng.randrange(256) for _ in range(3)))
        return Image.new("RGB", (w, h), rgb)
    pick = rng.random()
    if pick < 0.3:
        return _landscape(view, rng, np_rng)
    if pick < 0.65:
        return _clutter(view, rng, np_rng)
    # photo-like: smooth colour fields at a few scales, a horizon-like gradient, fine grain
    img = np.zeros((h, w, 3), dtype=np.float32)
    for cells, weight in ((rng.randint(2, 4), 1.0), (rng.randint(5, 12), 0.5)):
        small = Image.fromarray(np_rng.integers(0, 256, (cells, cells, 3)).astype(np.uint8))
        img += weight * np.asarray(small.resize((w, h), Image.BICUBIC), dtype=np.float32)
    img /= 1.5
    img += np.linspace(rng.uniform(-40, 40), rng.uniform(-40, 40), h, dtype=np.float32)[:, None, None]
    img += np_rng.normal(0, rng.uniform(2, 12), (h, w, 1))
    out = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    return out.filter(ImageFilter.GaussianBlur(rng.uniform(0, 1.5)))


def _landscape(view: View, rng: random.Random, np_rng: np.random.Generator) -> Image.Image:
    """Photograph-like: a sky band over a ground band, split by a wavy horizon, each a vertical
    blend of two random tones with a little texture."""
    h, w = view.height, view.width
    v = np.linspace(0, 1, h, dtype=np.float32)[:, None, None]
    x = np.linspace(0, 1, w, dtype=np.float32)[None, :]

    def band() -> np.ndarray:
        a, b = (np.array([rng.randrange(256) for _ in range(3)], np.float32) for _ in range(2))
        return a * (1 - v) + b * v + 15 * np.sin(rng.uniform(3, 15) * x + rng.uniform(0, 6))[..., None]

    horizon = rng.uniform(0.3, 0.7) + rng.uniform(0, 0.08) * np.sin(rng.uniform(2, 9) * x + rng.uniform(0, 6))
    below = (np.linspace(0, 1, h, dtype=np.float32)[:, None] > horizon)[..., None]
    arr = np.where(below, band(), band()) + np_rng.normal(0, rng.uniform(1, 8), (h, w, 1))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def _one_over_f(h: int, w: int, alpha: float, np_rng: np.random.Generator) -> np.ndarray:
    """Noise whose amplitude falls as 1 / frequency ** alpha (photographs: alpha near 1), unit std."""
    f = np.hypot(np.fft.fftfreq(h)[:, None], np.fft.fftfreq(w)[None, :])
    f[0, 0] = 1.0
    spectrum = (np_rng.normal(size=(h, w)) + 1j * np_rng.normal(size=(h, w))) / f ** alpha
    spectrum[0, 0] = 0.0
    field = np.fft.ifft2(spectrum).real
    return (field / (field.std() + 1e-6)).astype(np.float32)


def _clutter(view: View, rng: random.Random, np_rng: np.random.Generator) -> Image.Image:
    """Photograph-like: a 1/f colour field (a photograph's spectrum) behind shaded, textured, soft-edged
    blobs of any colour - many tones and soft edges, and no flat shape of one colour. A real photograph
    (a face, a product shot) was described as shapes by a model that had only seen smooth fields."""
    h, w = view.height, view.width
    mix = np.array([[1.0, 1.0, 1.0]], np.float32) + np_rng.normal(0, 0.4, (3, 3)).astype(np.float32)
    fields = np.stack([_one_over_f(h, w, rng.uniform(0.9, 1.6), np_rng) for _ in range(3)], -1)
    mean = np.array([rng.uniform(40, 215) for _ in range(3)], np.float32)
    img = mean + rng.uniform(15, 45) * (fields @ mix) / 1.7
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    texture = _one_over_f(h, w, 1.2, np_rng)[..., None]
    for _ in range(rng.randint(3, 10)):
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        # elongated (never a circle) and shaded and textured (never flat): nothing here is a known shape
        size, stretch = rng.uniform(0.06, 0.4) * min(w, h), rng.uniform(1.5, 3.5)
        rx, ry = size * stretch, size
        turn = rng.uniform(0, np.pi)
        dx, dy = xx - cx, yy - cy
        u = (dx * np.cos(turn) + dy * np.sin(turn)) / rx
        v = (-dx * np.sin(turn) + dy * np.cos(turn)) / ry
        r = np.sqrt(u * u + v * v)
        inside = np.clip((1.0 - r) / rng.uniform(0.05, 0.4), 0.0, 1.0)[..., None]  # soft edge
        colour = np.array([rng.uniform(0, 255) for _ in range(3)], np.float32)
        light = 1.0 + rng.uniform(0.3, 0.6) * (u * rng.uniform(-1, 1) + v * rng.uniform(-1, 1))[..., None]
        blob = colour * np.clip(light, 0.3, 1.6) * (1.0 + rng.uniform(0.15, 0.35) * texture)
        img = img * (1 - inside) + blob * inside
    img += np_rng.normal(0, rng.uniform(1, 6), (h, w, 1))
    out = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    return out.filter(ImageFilter.GaussianBlur(rng.uniform(0, 1.0)))


def outside_scene(rng: random.Random, kind: str | None = None) -> Scene:
    """A picture with no known shape; any question about it gets CANNOT_TELL."""
    kind = kind or rng.choice(OUTSIDE_KINDS)
    if kind not in OUTSIDE_KINDS:
        raise ValueError(f"kind must be one of {OUTSIDE_KINDS}, got {kind!r}")
    view = View(*rng.choice(PICTURE_SIZES))
    img = outside_picture(kind, view, rng)
    # Ask what would be asked of a real scene: the same phrasings, none of them answerable here.
    a, b = rng.sample(list(COLOURS), 2)
    pretend_shapes = [Shape(rng.choice(SHAPES), a, 0.3, 0.3, 0.3), Shape(rng.choice(SHAPES), b, 0.7, 0.7, 0.3)]
    pretend = _image_qas(pretend_shapes, [(0.3, 0.3), (0.7, 0.7)], rng)
    qas = [QA(q.question, CANNOT_TELL, OUTSIDE_QTYPE) for q in rng.sample(pretend, 3)]
    return Scene([img], [np.zeros((CANVAS, CANVAS), np.uint8)], [[]], kind, qas)


# ---------------------------------------------------------------- video scenes


def _video_qas(kind: str, shape: str, first: str | None, last: str | None, direction: str | None,
               rng: random.Random) -> list[QA]:
    qas = [QA(rng.choice(["What shape appears in the video?", "Which shape do you see in the video?",
                          "What shape is in this clip?", "What kind of shape is shown in the clip?"]),
              f"{_cap(_article(shape))} {shape}.", "appears")]
    if first is not None:
        qas.append(QA(rng.choice([f"What colour is the {shape} at the start?",
                                  "What color is the shape in the first frame?",
                                  f"What colour is the {shape} at the beginning of the video?",
                                  "Which colour does the shape have at first?"]), f"{_cap(first)}.", "first_colour"))
    if last is not None:
        qas.append(QA(rng.choice([f"What colour is the {shape} at the end?",
                                  "What color is the shape in the last frame?",
                                  f"What colour is the {shape} at the end of the video?",
                                  "Which colour does the shape have at the end?"]), f"{_cap(last)}.", "last_colour"))
    if direction is not None:
        qas.append(QA(rng.choice([f"Which way does the {shape} move?", "In which direction does the shape move?",
                                  f"Where does the {shape} go?", "Which direction is the shape moving in?",
                                  f"Which way is the {shape} going?", f"In what direction does the {shape} move?",
                                  f"Where is the {shape} heading?", f"Which direction is the {shape} travelling in?",
                                  f"What direction is the {shape} moving?"]),
                      f"{_cap(direction)}.", "direction"))
    event = {
        "move": f"It moves {direction}.",
        "recolour": f"It changes from {first} to {last}.",
        "appear": "It appears.",
        "disappear": "It disappears.",
    }[kind]
    qas.append(QA(rng.choice(["What happens in the video?", f"What does the {shape} do?",
                              "What happens to the shape?", "Describe what happens."]), event, "event"))
    return qas


def video_scene(rng: random.Random, n_frames: int | None = None, kind: str | None = None) -> Scene:
    """`kind` is one of VIDEO_KINDS; None draws one."""
    n = n_frames if n_frames is not None else rng.randint(4, 8)
    if not 2 <= n <= 16:
        raise ValueError(f"n_frames must be between 2 and 16, got {n}")
    kind = kind if kind is not None else rng.choice(("move", "move", "recolour", "appear", "disappear"))
    if kind not in VIDEO_KINDS:
        raise ValueError(f"kind must be one of {VIDEO_KINDS}, got {kind!r}")
    shape = rng.choice(SHAPES)
    view = View(*rng.choice(PICTURE_SIZES))
    bg_kind, bg_name = rng.choice(BACKGROUND_KINDS), rng.choice(list(BACKGROUNDS))
    size = rng.uniform(0.18, 0.34)
    lo, hi = size / 2 + 0.02, 1 - size / 2 - 0.02
    first = last = rng.choice(list(COLOURS))
    direction = None
    present = [True] * n
    colours = [first] * n
    if kind == "move":
        direction = rng.choice(list(DIRECTIONS))
        dx, dy = DIRECTIONS[direction]

        def ends(d: int) -> tuple[float, float]:
            if d == 0:
                c = rng.uniform(lo, hi)
                return c, c
            a, b = rng.uniform(lo, lo + 0.1), rng.uniform(hi - 0.1, hi)
            return (a, b) if d > 0 else (b, a)

        (x0, x1), (y0, y1) = ends(dx), ends(dy)
        centres = [(x0 + (x1 - x0) * t / (n - 1), y0 + (y1 - y0) * t / (n - 1)) for t in range(n)]
    else:
        c = (rng.uniform(lo, hi), rng.uniform(lo, hi))
        centres = [c] * n
        switch = rng.randint(max(1, n // 2 - 1), min(n - 1, n // 2 + 1))
        if kind == "recolour":
            first, last = rng.sample(list(COLOURS), 2)
            colours = [first if i < switch else last for i in range(n)]
        elif kind == "appear":
            present = [i >= switch for i in range(n)]
            first = None
        else:
            present = [i < switch for i in range(n)]
            last = None

    frames, masks, objects = [], [], []
    frame_rng = random.Random(rng.random())  # same background and jitter every frame: only the shape changes
    state = frame_rng.getstate()
    for (cx, cy), colour, here in zip(centres, colours, present):
        frame_rng.setstate(state)
        shapes = [Shape(shape, colour, cx, cy, size)] if here else []
        frames.append(render(shapes, view, bg_kind, bg_name, frame_rng))
        masks.append(label_mask(shapes))
        objects.append(shapes)
    return Scene(frames, masks, objects, bg_name, _video_qas(kind, shape, first, last, direction, rng))


# ---------------------------------------------------------------- datasets


def samples(n: int, seed: int, kind: str = "image") -> list[Sample]:
    """`n` single-question samples with question types in equal shares (round-robin); kind "outside"
    draws out-of-world pictures."""
    if kind not in ("image", "video", "outside"):
        raise ValueError(f"kind must be 'image', 'video' or 'outside', got {kind!r}")
    rng = random.Random(seed)
    out: list[Sample] = []
    if kind == "outside":
        for i in range(n):
            scene = outside_scene(rng, OUTSIDE_KINDS[i % len(OUTSIDE_KINDS)])
            qa = rng.choice(scene.qas)
            out.append(Sample(scene.frames, qa.question, qa.answer, qa.qtype))
        return out
    qtypes = IMAGE_QTYPES if kind == "image" else VIDEO_QTYPES
    while len(out) < n:
        want = qtypes[len(out) % len(qtypes)]
        scene = image_scene(rng) if kind == "image" else video_scene(rng)
        options = [qa for qa in scene.qas if qa.qtype == want]
        if options:
            qa = rng.choice(options)
            out.append(Sample(scene.frames, qa.question, qa.answer, qa.qtype))
    return out
