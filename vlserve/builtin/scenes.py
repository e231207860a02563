"""Synthetic scenes for the built-in model: coloured shapes on plain backgrounds, with questions.

Everything is drawn from a `random.Random(seed)`, so a seed fixes every pixel, question and answer.
An image scene has one to three shapes, each in its own quadrant of the canvas (so left/right and
top/bottom always have one answer, and shapes never overlap). A video scene has 4-8 frames of one
shape that either crosses the canvas or changes colour half-way through.

Each scene also keeps a label mask per frame (0 = background, k = k-th object), which training uses
for its per-patch auxiliary targets; serving never sees it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle")
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (40, 70, 230),
    "yellow": (240, 220, 30),
    "orange": (245, 140, 20),
    "purple": (140, 50, 190),
}
BACKGROUNDS = {"white": (250, 250, 250), "black": (15, 15, 15), "gray": (128, 128, 128)}
DIRECTIONS = ("left", "right", "up", "down")

IMAGE_QTYPES = ("colour", "shape", "count", "position", "caption")
VIDEO_QTYPES = ("direction", "first_colour", "last_colour", "appears")

CANVAS = 128  # drawn at twice the model's 64 px so edges are anti-aliased by the resize
NUMBER_WORDS = {0: "zero", 1: "one", 2: "two", 3: "three"}


@dataclass(frozen=True)
class Shape:
    shape: str
    colour: str
    cx: float  # centre, in canvas pixels
    cy: float
    size: float  # side of the bounding square, in canvas pixels


@dataclass
class QA:
    question: str
    answer: str
    qtype: str
    about: int | None = None  # index (in the frame's objects) of the shape the question names


@dataclass
class Scene:
    """A drawn image (one frame) or video (4-8 frames) with every question it can answer."""

    frames: list[Image.Image]
    masks: list[np.ndarray]  # per frame, uint8 (CANVAS, CANVAS): 0 background, k = objects[k-1]
    objects: list[list[Shape]]  # per frame, the shapes drawn in it
    background: str
    qas: list[QA]

    @property
    def is_video(self) -> bool:
        return len(self.frames) > 1


@dataclass
class Sample:
    """One question about one image or video; `images` holds 1 image or the 4-8 frames of a video."""

    images: list[Image.Image]
    question: str
    answer: str
    qtype: str


# ---------------------------------------------------------------- drawing


def _jitter(rgb: tuple[int, int, int], rng: random.Random) -> tuple[int, int, int]:
    return tuple(max(0, min(255, c + rng.randint(-12, 12))) for c in rgb)


def _polygon(s: Shape) -> list[tuple[float, float]] | None:
    h = s.size / 2
    if s.shape == "triangle":
        return [(s.cx, s.cy - h), (s.cx + h, s.cy + h), (s.cx - h, s.cy + h)]
    return None


def _draw(draw: ImageDraw.ImageDraw, s: Shape, fill) -> None:
    h = s.size / 2
    box = [s.cx - h, s.cy - h, s.cx + h, s.cy + h]
    if s.shape == "circle":
        draw.ellipse(box, fill=fill)
    elif s.shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon(_polygon(s), fill=fill)


def render(shapes: list[Shape], background: str, rng: random.Random) -> tuple[Image.Image, np.ndarray]:
    img = Image.new("RGB", (CANVAS, CANVAS), _jitter(BACKGROUNDS[background], rng))
    mask = Image.new("L", (CANVAS, CANVAS), 0)
    d_img, d_mask = ImageDraw.Draw(img), ImageDraw.Draw(mask)
    for k, s in enumerate(shapes, start=1):
        _draw(d_img, s, _jitter(COLOURS[s.colour], rng))
        _draw(d_mask, s, k)
    return img, np.asarray(mask, dtype=np.uint8).copy()


def patch_blocks(mask: np.ndarray, grid: int) -> np.ndarray:
    """A label mask cut into the model's grid x grid patches: [grid * grid, pixels per patch],
    patches in row-major order (the order of the image tokens)."""
    block = CANVAS // grid
    return mask.reshape(grid, block, grid, block).transpose(0, 2, 1, 3).reshape(grid * grid, -1)


# ---------------------------------------------------------------- image scenes


def _place_in_quadrant(q: int, rng: random.Random) -> tuple[float, float, float]:
    """Centre and size of a shape inside quadrant q (0 TL, 1 TR, 2 BL, 3 BR), margin kept."""
    half = CANVAS // 2
    size = rng.uniform(0.38, 0.78) * half
    lo, hi = size / 2 + 3, half - size / 2 - 3
    cx = (q % 2) * half + rng.uniform(lo, hi)
    cy = (q // 2) * half + rng.uniform(lo, hi)
    return cx, cy, size


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _join(phrases: list[str]) -> str:
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + " and " + phrases[-1]


def caption_of(shapes: list[Shape], background: str) -> str:
    """Shapes in reading order (top row first, then left to right), then the background."""
    ordered = sorted(shapes, key=lambda s: (s.cy >= CANVAS / 2, s.cx))
    named = [f"{_article(s.colour)} {s.colour} {s.shape}" for s in ordered]
    text = _join(named)
    return f"{text[0].upper()}{text[1:]} on a {background} background."


def _image_qas(shapes: list[Shape], background: str, rng: random.Random) -> list[QA]:
    qas: list[QA] = []
    shape_counts = {name: sum(s.shape == name for s in shapes) for name in SHAPES}
    only = len(shapes) == 1

    for k, s in enumerate(shapes):
        if shape_counts[s.shape] == 1:
            noun = "shape" if only and rng.random() < 0.4 else s.shape
            q = rng.choice([
                f"What colour is the {noun}?",
                f"What color is the {noun}?",
                f"Which colour is the {noun}?",
                f"Tell me the colour of the {noun}.",
                f"The {noun} is what color?",
            ])
            qas.append(QA(q, s.colour, "colour", about=k))
        thing = "shape" if only and rng.random() < 0.4 else f"{s.colour} object"
        q = rng.choice([
            f"What shape is the {thing}?",
            f"Which shape is {s.colour}?" if not only or rng.random() < 0.5 else "What shape is in the image?",
            f"What kind of shape is the {thing}?",
            f"Name the shape that is {s.colour}.",
        ])
        qas.append(QA(q, s.shape, "shape", about=k))
        who = f"{s.colour} {s.shape}"
        if rng.random() < 0.5:
            q = rng.choice([
                f"Is the {who} on the left or the right?",
                f"Is the {who} on the left side or the right side?",
                f"Which side is the {who} on, left or right?",
                f"Left or right: where is the {who}?",
            ])
            qas.append(QA(q, "left" if s.cx < CANVAS / 2 else "right", "position", about=k))
        else:
            q = rng.choice([
                f"Is the {who} at the top or the bottom?",
                f"Is the {who} in the top half or the bottom half?",
                f"Where is the {who}, top or bottom?",
                f"Top or bottom: where is the {who}?",
            ])
            qas.append(QA(q, "top" if s.cy < CANVAS / 2 else "bottom", "position", about=k))

    if rng.random() < 0.5:
        q = rng.choice([
            "How many shapes are there?",
            "How many shapes are in the image?",
            "Count the shapes.",
            "How many objects can you see?",
        ])
        qas.append(QA(q, str(len(shapes)), "count"))
    else:
        name = rng.choice(SHAPES)
        q = rng.choice([f"How many {name}s are there?", f"How many {name}s are in the picture?", f"Count the {name}s."])
        qas.append(QA(q, str(shape_counts[name]), "count"))

    q = rng.choice([
        "Describe the image in one sentence.",
        "What is in the image?",
        "Write a short caption for this picture.",
        "Describe what you see.",
        "Give a one-sentence description of the image.",
    ])
    qas.append(QA(q, caption_of(shapes, background), "caption"))
    return qas


def image_scene(rng: random.Random) -> Scene:
    n = rng.choice((1, 2, 2, 3, 3))
    quadrants = rng.sample(range(4), n)
    colours = rng.sample(list(COLOURS), n)  # distinct, so "the red object" always names one shape
    shapes = []
    for q, colour in zip(quadrants, colours):
        cx, cy, size = _place_in_quadrant(q, rng)
        shapes.append(Shape(rng.choice(SHAPES), colour, cx, cy, size))
    background = rng.choice(list(BACKGROUNDS))
    img, mask = render(shapes, background, rng)
    return Scene([img], [mask], [shapes], background, _image_qas(shapes, background, rng))


# ---------------------------------------------------------------- video scenes


def _video_qas(kind: str, shape: str, first: str, last: str, direction: str | None, rng: random.Random) -> list[QA]:
    qas = [
        QA(rng.choice([
            "What shape appears in the video?",
            "Which shape do you see in the video?",
            "What appears in this video?",
            "What kind of shape is shown in the clip?",
        ]), shape, "appears"),
        QA(rng.choice([
            f"What colour is the {shape} at the start?",
            "What color is the shape in the first frame?",
            f"What colour is the {shape} at the beginning of the video?",
            "Which colour does the shape have at first?",
        ]), first, "first_colour"),
        QA(rng.choice([
            f"What colour is the {shape} at the end?",
            "What color is the shape in the last frame?",
            f"What colour is the {shape} at the end of the video?",
            "Which colour does the shape have at the end?",
        ]), last, "last_colour"),
    ]
    if direction is not None:
        qas.append(QA(rng.choice([
            f"Which way does the {shape} move?",
            "In which direction does the shape move?",
            f"Does the {shape} move left, right, up or down?",
            "Where is the shape moving?",
        ]), direction, "direction"))
    return qas


def video_scene(rng: random.Random, n_frames: int | None = None, kind: str | None = None) -> Scene:
    """`kind` is "move" or "recolour"; None draws one (half each)."""
    n = n_frames if n_frames is not None else rng.randint(4, 8)
    if not 2 <= n <= 16:
        raise ValueError(f"n_frames must be between 2 and 16, got {n}")
    shape = rng.choice(SHAPES)
    background = rng.choice(list(BACKGROUNDS))
    size = rng.uniform(0.22, 0.36) * CANVAS
    margin = size / 2 + 3
    if kind is None:
        kind = rng.choice(("move", "recolour"))
    elif kind not in ("move", "recolour"):
        raise ValueError(f"kind must be 'move' or 'recolour', got {kind!r}")
    if kind == "move":
        first = last = rng.choice(list(COLOURS))
        direction = rng.choice(DIRECTIONS)
        start, end = rng.uniform(margin, margin + 10), rng.uniform(CANVAS - margin - 10, CANVAS - margin)
        if direction in ("left", "up"):
            start, end = CANVAS - start, CANVAS - end
        other = rng.uniform(margin, CANVAS - margin)
        path = [start + (end - start) * t / (n - 1) for t in range(n)]
        centres = [(p, other) if direction in ("left", "right") else (other, p) for p in path]
        colours = [first] * n
    else:
        first, last = rng.sample(list(COLOURS), 2)
        direction = None
        cx, cy = rng.uniform(margin, CANVAS - margin), rng.uniform(margin, CANVAS - margin)
        centres = [(cx, cy)] * n
        switch = rng.randint(max(1, n // 2 - 1), min(n - 1, n // 2 + 1))
        colours = [first if i < switch else last for i in range(n)]

    frames, masks, objects = [], [], []
    frame_rng = random.Random(rng.random())  # same jitter every frame: only the motion/colour changes
    state = frame_rng.getstate()
    for (cx, cy), colour in zip(centres, colours):
        frame_rng.setstate(state)
        shapes = [Shape(shape, colour, cx, cy, size)]
        img, mask = render(shapes, background, frame_rng)
        frames.append(img)
        masks.append(mask)
        objects.append(shapes)
    return Scene(frames, masks, objects, background, _video_qas(kind, shape, first, last, direction, rng))


# ---------------------------------------------------------------- datasets


def scenes(seed: int, video_fraction: float = 0.0):
    """Endless stream of scenes; a video with probability `video_fraction`."""
    rng = random.Random(seed)
    while True:
        yield video_scene(rng) if rng.random() < video_fraction else image_scene(rng)


def samples(n: int, seed: int, kind: str = "image") -> list[Sample]:
    """`n` single-question samples with question types in equal shares (round-robin)."""
    if kind not in ("image", "video"):
        raise ValueError(f"kind must be 'image' or 'video', got {kind!r}")
    qtypes = IMAGE_QTYPES if kind == "image" else VIDEO_QTYPES
    rng = random.Random(seed)
    out: list[Sample] = []
    while len(out) < n:
        want = qtypes[len(out) % len(qtypes)]
        scene = image_scene(rng) if kind == "image" else video_scene(rng)
        options = [qa for qa in scene.qas if qa.qtype == want]
        if options:
            qa = rng.choice(options)
            out.append(Sample(scene.frames, qa.question, qa.answer, qa.qtype))
    return out
