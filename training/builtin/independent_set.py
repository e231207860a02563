"""A second, independent test set for the built-in model: hand-written phrasings and expected answers
about pictures drawn here with Pillow, none of it taken from the training generator (scenes.py).

It asks what a new user types: short questions ("how many?", "colour of the circle?"), odd casing and
punctuation, relations (above/below, left/right of, the biggest, the one at the top), crowded pictures
(up to six small, overlapping shapes), canvases of many sizes and aspect ratios, videos asked about
with verbs of their own ("slide", "drift", "vanish"), and questions outside the model's world ("what
breed is the dog?", "read the text"), whose expected answer is the fixed "cannot tell" sentence.

The processor keeps the centre square of a picture (CLIP's resize-and-crop), so every shape is drawn
inside the canvas's central square; the canvas around it is background the model does not see.

    python -m training.builtin.evaluate --independent       # this set's table beside the generator's
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from vlserve.builtin.scenes import CANNOT_TELL

# Paint and grounds of this set's own choosing, each plainly the colour it is called.
PAINT = {"red": (200, 35, 40), "green": (50, 165, 60), "blue": (35, 85, 215), "yellow": (245, 215, 50),
         "orange": (250, 130, 35), "purple": (125, 45, 165)}
GROUNDS = ((255, 255, 255), (244, 242, 236), (215, 215, 215), (150, 150, 150), (70, 70, 72), (22, 22, 26))
CANVASES = ((400, 300), (300, 400), (640, 480), (480, 640), (256, 144), (144, 256), (320, 320), (500, 250),
            (250, 500), (224, 224), (800, 600), (180, 120))  # width, height
KINDS = ("circle", "square", "triangle")
NUMBER = {1: "One", 2: "Two", 3: "Three", 4: "Four", 5: "Five", 6: "Six"}
QTYPES = ("colour", "shape", "count", "position", "exists", "caption", "relation", "video", "outside")


@dataclass(frozen=True)
class Fig:
    kind: str
    colour: str
    x: float  # centre, as a fraction of the visible square
    y: float
    r: float  # half the side of its bounding square, as a fraction of the visible square


@dataclass
class Item:
    images: list[Image.Image]
    question: str
    answer: str  # the expected answer, in the model's answer style
    qtype: str
    tags: tuple[str, ...] = ()  # "crowded", "wide"/"tall", "N shapes" (how many? of N): slices the report shows


# ---------------------------------------------------------------- drawing


def _box(f: Fig, left: float, top: float, side: float) -> tuple[float, float, float, float]:
    cx, cy, h = left + f.x * side, top + f.y * side, f.r * side
    return cx - h, cy - h, cx + h, cy + h


def draw(figs: list[Fig], canvas: tuple[int, int], ground=(255, 255, 255), text: str | None = None) -> Image.Image:
    """The figures, in order (later ones on top), inside the canvas's central square."""
    w, h = canvas
    side = min(w, h)
    left, top = (w - side) / 2, (h - side) / 2
    img = Image.new("RGB", canvas, ground)
    d = ImageDraw.Draw(img)
    for f in figs:
        x0, y0, x1, y1 = _box(f, left, top, side)
        if f.kind == "circle":
            d.ellipse((x0, y0, x1, y1), fill=PAINT[f.colour])
        elif f.kind == "square":
            d.rectangle((x0, y0, x1, y1), fill=PAINT[f.colour])
        else:
            d.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=PAINT[f.colour])
    if text:
        ink = (0, 0, 0) if sum(ground) > 380 else (255, 255, 255)
        d.text((left + side * 0.08, top + side * 0.05), text, fill=ink, font_size=max(10, side // 9))
    return img


def visible_share(figs: list[Fig], k: int) -> float:
    """How much of figure k the figures drawn after it leave uncovered (on a 200-px square)."""
    def mask(f: Fig) -> np.ndarray:
        return np.asarray(draw([Fig(f.kind, "red", f.x, f.y, f.r)], (200, 200), (0, 0, 0)))[..., 0] > 0

    own = mask(figs[k])
    if not own.any():
        return 0.0
    covered = np.zeros_like(own)
    for f in figs[k + 1:]:
        covered |= mask(f)
    return float((own & ~covered).sum() / own.sum())


# ---------------------------------------------------------------- phrasings (hand-written)

# "{n}" is a shape word, "{c}" a colour word, "{cn}" "<colour> <shape>".
COLOUR_QS = ["colour of the {n}?", "What's the {n}'s colour?", "what colour is the {n}", "The {n}: what colour?",
             "which colour has the {n} got?", "COLOR OF THE {N}?", "the {n} is which color", "{n} colour?",
             "What colour has been used for the {n}?", "what color's the {n}?", "Tell me the {n}'s colour",
             "In what colour is the {n} painted?", "What colour would you call the {n}?", "the {n}'s color?"]
SHAPE_QS = ["What is the {c} thing?", "which shape is the {c} one", "the {c} shape is a what?", "{c} shape?",
            "What shape has been drawn in {c}?", "WHAT IS THE {C} SHAPE?", "what's the {c} object",
            "Identify the {c} shape.", "tell me what the {c} figure is", "What kind of figure is {c}?",
            "what is painted {c}?", "Which figure is {c}"]
COUNT_QS = ["how many?", "How many shapes?", "How many shapes are there?", "count them", "Number of shapes?",
            "HOW MANY SHAPES", "how many things do you see", "How many figures are drawn?",
            "what's the total number of shapes?", "How many objects are in this drawing?", "count the figures",
            "shapes: how many?"]
COUNT_KIND_QS = ["how many {n}s?", "How many {n}s are drawn?", "count the {n}s", "Number of {n}s?",
                 "how many {n}s are in it"]
COUNT_COLOUR_QS = ["how many {c} shapes?", "How many {c} things are there?", "count the {c} figures"]
POSITION_QS = ["Where is the {n}?", "where's the {cn}", "Where is the {cn} placed?", "location of the {n}?",
               "WHERE IS THE {N}?", "where can the {n} be seen", "Whereabouts is the {cn}?",
               "the {n} is where?", "where in the picture is the {n}", "Where has the {cn} been drawn?"]
EXISTS_QS = ["is there a {cn}?", "Any {cn}?", "Is a {cn} in the picture?", "{cn}?", "Does it have a {cn}",
             "IS THERE A {CN}?", "can you spot a {cn}?", "Is there a {cn} anywhere?", "does the image show a {cn}",
             "Do I see a {cn} here?"]
CAPTION_QS = ["What's in it?", "describe it", "Caption?", "what does the picture show", "Describe the drawing.",
              "WHAT IS SHOWN?", "Summarise the image in a sentence.", "what's drawn here", "give me a caption",
              "What does this image contain?"]
# Relations: the expected answer names the shape (with its colour where the question asks "which one").
ABOVE_QS = ["What is above the {n}?", "which shape is over the {n}", "What's on top of the {n}?",
            "what sits above the {n}"]
BELOW_QS = ["What is below the {n}?", "which shape is under the {n}", "What's beneath the {n}?"]
LEFT_OF_QS = ["What is left of the {n}?", "which shape is to the left of the {n}", "What's on the {n}'s left?"]
RIGHT_OF_QS = ["What is right of the {n}?", "which shape is to the right of the {n}", "What's to the {n}'s right?"]
TOP_QS = ["What shape is at the top?", "which one is at the top", "What is the topmost shape?",
          "the highest shape is what?"]
BOTTOM_QS = ["What shape is at the bottom?", "which one is lowest", "What is the bottom shape?"]
LEFTMOST_QS = ["Which shape is furthest left?", "what is the leftmost shape", "the one on the far left is what?"]
RIGHTMOST_QS = ["Which shape is furthest right?", "what's the rightmost one", "the one on the far right?"]
BIGGEST_QS = ["Which shape is the biggest?", "what is the largest shape", "Which one is biggest?",
              "the biggest one is what?"]
SMALLEST_QS = ["Which shape is the smallest?", "what's the tiniest shape", "which one is smallest"]
IS_ABOVE_QS = ["Is the {a} above the {b}?", "is the {a} higher than the {b}", "Is the {a} over the {b}?"]
IS_LEFT_QS = ["Is the {a} left of the {b}?", "is the {a} to the left of the {b}", "Is the {a} on the {b}'s left?"]
# Videos, asked with verbs the generator does not use.
VIDEO_DIRECTION_QS = ["Which way does the {n} slide?", "where does the {n} drift?", "In what direction does it travel?",
                      "which way is it heading", "Where does the {n} glide to?", "the {n} travels which way?",
                      "What direction does the {n} shift in?", "where does it wander"]
VIDEO_FIRST_QS = ["what colour does the {n} start out?", "The {n}'s colour at first?", "initial colour of the {n}?"]
VIDEO_LAST_QS = ["what colour does the {n} end up?", "The {n}'s colour in the end?", "final colour of the {n}?"]
VIDEO_WHICH_QS = ["What shape shows up in the clip?", "which shape is in the video", "what figure does the clip show?"]
VIDEO_EVENT_QS = ["What is going on?", "what happens to it", "Describe the clip.", "What does the {n} do here?"]
# Out of its world: what a user might ask that no shape answers.
OUTSIDE_QS = ["What breed is the dog?", "read the text", "What does the sign say?", "Who is in this picture?",
              "What time is it on the clock?", "what brand is the car", "How old is the man?",
              "What is the weather like?", "What is written here?", "Which city is this?",
              "what animal is this", "What is the person holding?", "How much does it cost?",
              "What language is the text in?", "is the food tasty?", "What is the woman's name?",
              "What song is playing?", "translate the text", "What country's flag is this?",
              "what is the cat doing"]


def _phrase(template: str, **words: str) -> str:
    """Fill a template; an upper-case placeholder gets the word in capitals."""
    out = template
    for key, word in words.items():
        out = out.replace("{" + key + "}", word).replace("{" + key.upper() + "}", word.upper())
    return out


# ---------------------------------------------------------------- answers


def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


def _an(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _named(f: Fig) -> str:
    return f"{_an(f.colour)} {f.colour} {f.kind}"


def caption(figs: list[Fig]) -> str:
    groups: dict[tuple[str, str], int] = {}
    for f in figs:
        groups[(f.colour, f.kind)] = groups.get((f.colour, f.kind), 0) + 1
    parts = [f"{_an(c)} {c} {k}" if n == 1 else f"{NUMBER[n].lower()} {c} {k}s" for (c, k), n in groups.items()]
    return _cap(", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]) + "."


def zone(f: Fig) -> str | None:
    """Where a figure's centre is, in the model's answer words, or None between zones."""
    h = "left" if f.x < 0.32 else "right" if f.x > 0.68 else "centre" if 0.42 < f.x < 0.58 else None
    v = "top" if f.y < 0.32 else "bottom" if f.y > 0.68 else "centre" if 0.42 < f.y < 0.58 else None
    if h is None or v is None:
        return None
    if h == v == "centre":
        return "In the centre."
    return f"On the {h}." if v == "centre" else f"At the {v}." if h == "centre" else f"At the {v} {h}."


# ---------------------------------------------------------------- scenes


def _tags(canvas: tuple[int, int], figs: list[Fig]) -> tuple[str, ...]:
    shape = "square" if canvas[0] == canvas[1] else "wide" if canvas[0] > canvas[1] else "tall"
    return ("crowded",) * (len(figs) >= 5) + (shape,)


def scatter(rng: random.Random, n: int, sizes=(0.1, 0.2), overlap: bool = False,
            colours: list[str] | None = None) -> list[Fig]:
    """n figures at random, each at least 60% visible (overlapping when asked) and no two of one
    colour and kind, so every one can be named."""
    while True:
        taken: set[tuple[str, str]] = set()
        figs = []
        for i in range(n):
            r = rng.uniform(*sizes)
            while True:
                kind = rng.choice(KINDS)
                colour = colours[i] if colours else rng.choice(list(PAINT))
                if (colour, kind) not in taken:
                    break
            taken.add((colour, kind))
            figs.append(Fig(kind, colour, rng.uniform(r + 0.03, 0.97 - r), rng.uniform(r + 0.03, 0.97 - r), r))
        touching = any(_apart(a, b) < 1.0 for i, a in enumerate(figs) for b in figs[i + 1:])
        if overlap and not touching:
            continue
        if not overlap and any(_apart(a, b) < 1.15 for i, a in enumerate(figs) for b in figs[i + 1:]):
            continue
        if all(visible_share(figs, k) >= 0.6 for k in range(n)):
            return figs


def _apart(a: Fig, b: Fig) -> float:
    """Centre distance over the sum of half-sizes: below 1 the bounding squares' circles meet."""
    return ((a.x - b.x) ** 2 + (a.y - b.y) ** 2) ** 0.5 / (a.r + b.r)


# ---------------------------------------------------------------- the set


def _image(rng: random.Random, figs: list[Fig], text: str | None = None) -> tuple[Image.Image, tuple[str, ...]]:
    canvas = rng.choice(CANVASES)
    return draw(figs, canvas, rng.choice(GROUNDS), text), _tags(canvas, figs)


def issue_cases() -> list[Item]:
    """The four exchanges issue 49 reports, drawn as described there."""
    two = [Fig("circle", "blue", 0.3, 0.55, 0.14), Fig("square", "yellow", 0.72, 0.4, 0.12)]
    stacked = [Fig("square", "green", 0.5, 0.25, 0.14), Fig("triangle", "orange", 0.5, 0.72, 0.15)]
    over = [Fig("circle", "blue", 0.5, 0.5, 0.3), Fig("square", "red", 0.68, 0.62, 0.1)]
    img = draw(two, (400, 300))
    return [Item([img], "How many shapes are there?", "Two.", "count", ("wide",)),
            Item([img], "Where is the square?", "On the right.", "position", ("wide",)),
            Item([draw(stacked, (300, 300))], "What shape is at the top?", "A square.", "relation", ("square",)),
            Item([draw(over, (320, 320))], "Is there a red square?", "Yes.", "exists", ("square",))]


def _image_items(rng: random.Random, n_scenes: int) -> list[Item]:
    out: list[Item] = []
    for i in range(n_scenes):
        n = (1, 2, 3, 4, 5, 6)[i % 6]
        small = n >= 5
        figs = scatter(rng, n, (0.07, 0.13) if small else (0.1, 0.22) if n > 2 else (0.12, 0.3), overlap=small)
        img, tags = _image(rng, figs)
        unique_kind = [f for f in figs if sum(g.kind == f.kind for g in figs) == 1]
        unique_colour = [f for f in figs if sum(g.colour == f.colour for g in figs) == 1]
        ask = lambda q, a, t: out.append(Item([img], q, a, t, tags))  # noqa: E731
        if unique_kind:
            f = rng.choice(unique_kind)
            ask(_phrase(rng.choice(COLOUR_QS), n=f.kind), f"{_cap(f.colour)}.", "colour")
        if unique_colour:
            f = rng.choice(unique_colour)
            ask(_phrase(rng.choice(SHAPE_QS), c=f.colour), f"{_cap(_an(f.kind))} {f.kind}.", "shape")
        pick = rng.random()
        if pick < 0.5:  # the count of every shape, also sliced by that count ("4 shapes")
            out.append(Item([img], rng.choice(COUNT_QS), f"{NUMBER[n]}.", "count", tags + (f"{n} shapes",)))
        elif pick < 0.8:
            kind = rng.choice(KINDS)
            k = sum(f.kind == kind for f in figs)
            ask(_phrase(rng.choice(COUNT_KIND_QS), n=kind), f"{NUMBER[k]}." if k else "None.", "count")
        else:
            colour = rng.choice([f.colour for f in figs])
            k = sum(f.colour == colour for f in figs)
            ask(_phrase(rng.choice(COUNT_COLOUR_QS), c=colour), f"{NUMBER[k]}.", "count")
        placed = [f for f in figs if zone(f)]
        if placed:
            f = rng.choice(placed)
            named = f.kind if f in unique_kind else f"{f.colour} {f.kind}"
            t = rng.choice(POSITION_QS)
            ask(_phrase(t, n=named, cn=f"{f.colour} {f.kind}"), zone(f), "position")
        if rng.random() < 0.5:
            f = rng.choice(figs)
            ask(_phrase(rng.choice(EXISTS_QS), cn=f"{f.colour} {f.kind}"), "Yes.", "exists")
        else:
            absent = [(c, k) for c in PAINT for k in KINDS if not any((f.colour, f.kind) == (c, k) for f in figs)]
            c, k = rng.choice(absent)
            ask(_phrase(rng.choice(EXISTS_QS), cn=f"{c} {k}"), "No.", "exists")
        if n <= 4 or i % 2:
            ask(rng.choice(CAPTION_QS), caption(figs), "caption")
    return out


def _relation_items(rng: random.Random, n_scenes: int) -> list[Item]:
    """Two or three shapes of distinct kinds, placed so that the relation asked has one answer."""
    out: list[Item] = []
    for i in range(n_scenes):
        kinds = rng.sample(KINDS, rng.choice((2, 3)))
        colours = rng.sample(list(PAINT), len(kinds))
        form = i % 5
        if form == 0:  # a column: above / below / top / bottom
            ys = sorted(rng.sample((0.18, 0.5, 0.82), len(kinds)))
            figs = [Fig(k, c, 0.5 + rng.uniform(-0.12, 0.12), y, rng.uniform(0.09, 0.12))
                    for k, c, y in zip(kinds, colours, ys)]
        elif form == 1:  # a row: left of / right of / leftmost / rightmost
            xs = sorted(rng.sample((0.18, 0.5, 0.82), len(kinds)))
            figs = [Fig(k, c, x, 0.5 + rng.uniform(-0.12, 0.12), rng.uniform(0.09, 0.12))
                    for k, c, x in zip(kinds, colours, xs)]
        else:  # sizes that differ plainly: biggest / smallest, or yes/no relations
            figs = scatter(rng, len(kinds), (0.1, 0.2), colours=colours)
            figs = [Fig(k, f.colour, f.x, f.y, f.r) for k, f in zip(kinds, figs)]
            if form in (2, 3):
                radii = sorted(rng.sample((0.07, 0.13, 0.21), len(kinds)))
                figs = [Fig(f.kind, f.colour, f.x, f.y, r) for f, r in zip(figs, radii)]
                figs = _fit(figs)
                if figs is None:
                    continue
        img, tags = _image(rng, figs)
        ask = lambda q, a: out.append(Item([img], q, a, "relation", tags))  # noqa: E731
        by_y, by_x, by_r = (sorted(figs, key=lambda f, key=key: getattr(f, key)) for key in ("y", "x", "r"))
        shape_of = lambda f: f"{_cap(_an(f.kind))} {f.kind}."  # noqa: E731
        if form == 0:
            a, b = rng.choice(list(zip(by_y, by_y[1:])))
            q = rng.choice([(ABOVE_QS, b, a), (BELOW_QS, a, b), (TOP_QS, None, by_y[0]), (BOTTOM_QS, None, by_y[-1])])
        elif form == 1:
            a, b = rng.choice(list(zip(by_x, by_x[1:])))
            q = rng.choice([(LEFT_OF_QS, b, a), (RIGHT_OF_QS, a, b), (LEFTMOST_QS, None, by_x[0]),
                            (RIGHTMOST_QS, None, by_x[-1])])
        elif form in (2, 3):
            q = rng.choice([(BIGGEST_QS, None, by_r[-1]), (SMALLEST_QS, None, by_r[0])])
        else:
            a, b = rng.sample(figs, 2)
            if abs(a.y - b.y) > 0.2 and rng.random() < 0.5:
                ask(_phrase(rng.choice(IS_ABOVE_QS), a=a.kind, b=b.kind), "Yes." if a.y < b.y else "No.")
            elif abs(a.x - b.x) > 0.2:
                ask(_phrase(rng.choice(IS_LEFT_QS), a=a.kind, b=b.kind), "Yes." if a.x < b.x else "No.")
            continue
        templates, ref, answer = q
        ask(_phrase(rng.choice(templates), n=ref.kind if ref else ""), shape_of(answer))
    return out


def _fit(figs: list[Fig]) -> list[Fig] | None:
    """Pull resized figures inside the square; None if they now touch."""
    out = [Fig(f.kind, f.colour, min(max(f.x, f.r + 0.03), 0.97 - f.r), min(max(f.y, f.r + 0.03), 0.97 - f.r), f.r)
           for f in figs]
    if any(_apart(a, b) < 1.1 for i, a in enumerate(out) for b in out[i + 1:]):
        return None
    return out


DIRECTION_STEPS = {"Left.": (-1, 0), "Right.": (1, 0), "Up.": (0, -1), "Down.": (0, 1),
                   "Up and to the left.": (-1, -1), "Up and to the right.": (1, -1),
                   "Down and to the left.": (-1, 1), "Down and to the right.": (1, 1)}


def _video_items(rng: random.Random, n_videos: int) -> list[Item]:
    out: list[Item] = []
    for i in range(n_videos):
        kind, colour = rng.choice(KINDS), rng.choice(list(PAINT))
        canvas, ground = rng.choice(CANVASES), rng.choice(GROUNDS)
        frames_n = rng.randint(4, 8)
        r = rng.uniform(0.09, 0.15)
        tags = _tags(canvas, [])
        story = i % 4
        if story < 2:  # a move
            answer = rng.choice(list(DIRECTION_STEPS))
            dx, dy = DIRECTION_STEPS[answer]
            x0 = 0.5 - dx * rng.uniform(0.22, 0.3)
            y0 = 0.5 - dy * rng.uniform(0.22, 0.3)
            span = rng.uniform(0.44, 0.56)
            frames = [draw([Fig(kind, colour, x0 + dx * span * t / (frames_n - 1), y0 + dy * span * t / (frames_n - 1),
                                r)], canvas, ground) for t in range(frames_n)]
            if story == 0:
                q = _phrase(rng.choice(VIDEO_DIRECTION_QS), n=kind)
                out.append(Item(frames, q, answer, "video", tags))
            else:
                q = _phrase(rng.choice(VIDEO_EVENT_QS), n=kind)
                out.append(Item(frames, q, f"It moves {answer[0].lower()}{answer[1:]}", "video", tags))
            continue
        x, y = rng.uniform(0.3, 0.7), rng.uniform(0.3, 0.7)
        switch = rng.randint(2, frames_n - 2)
        if story == 2:  # a colour change
            last = rng.choice([c for c in PAINT if c != colour])
            frames = [draw([Fig(kind, colour if t < switch else last, x, y, r)], canvas, ground)
                      for t in range(frames_n)]
            q, a = rng.choice([(VIDEO_FIRST_QS, f"{_cap(colour)}."), (VIDEO_LAST_QS, f"{_cap(last)}."),
                               (VIDEO_EVENT_QS, f"It changes from {colour} to {last}.")])
            out.append(Item(frames, _phrase(rng.choice(q), n=kind), a, "video", tags))
        else:  # it appears or vanishes
            appears = rng.random() < 0.5
            frames = [draw([Fig(kind, colour, x, y, r)] if (t >= switch) == appears else [], canvas, ground)
                      for t in range(frames_n)]
            if rng.random() < 0.5:
                q, a = rng.choice(VIDEO_WHICH_QS), f"{_cap(_an(kind))} {kind}."
            else:
                q, a = _phrase(rng.choice(VIDEO_EVENT_QS), n=kind), "It appears." if appears else "It disappears."
            out.append(Item(frames, q, a, "video", tags))
    return out


def _outside_items(rng: random.Random) -> list[Item]:
    """Every out-of-world question twice: once about a drawing of shapes (some with a word written on
    it), once about a photograph-like picture of smooth colour."""
    out = []
    for q in OUTSIDE_QS:
        figs = scatter(rng, rng.randint(1, 3), (0.1, 0.2))
        text = rng.choice([None, "SALE", "hello", "OPEN 9-5"]) if "text" in q or "written" in q or "sign" in q else None
        img, tags = _image(rng, figs, text)
        out.append(Item([img], q, CANNOT_TELL, "outside", tags))
        w, h = rng.choice(CANVASES)
        field = Image.radial_gradient("L").resize((w, h))
        tint = Image.new("RGB", (w, h), tuple(rng.randrange(60, 200) for _ in range(3)))
        photo = Image.composite(tint, Image.new("RGB", (w, h), tuple(rng.randrange(256) for _ in range(3))), field)
        out.append(Item([photo], q, CANNOT_TELL, "outside", _tags((w, h), [])))
    return out


def build(seed: int = 49) -> list[Item]:
    """The whole set; a fixed seed places the shapes, so the set is the same every run."""
    rng = random.Random(seed)
    return (issue_cases() + _image_items(rng, 84) + _relation_items(rng, 90) + _video_items(rng, 64)
            + _outside_items(rng))


# ---------------------------------------------------------------- scoring


_WORD = re.compile(r"[a-z]+")


def _mentions(text: str) -> tuple[set[str], set[str]]:
    words = set(_WORD.findall(text.lower().replace("color", "colour")))
    return words & set(KINDS) | {k for k in KINDS if k + "s" in words}, words & set(PAINT)


def relation_correct(prediction: str, reference: str) -> bool:
    """A shape-naming relation answer is right when it names the expected shape and no other (and,
    where the reference gives a colour, that colour and no other); yes/no answers must match."""
    if reference in ("Yes.", "No."):
        return prediction.strip().rstrip(".").lower() == reference.rstrip(".").lower()
    p_kinds, p_colours = _mentions(prediction)
    r_kinds, r_colours = _mentions(reference)
    return p_kinds == r_kinds and (not r_colours or p_colours == r_colours)


def is_right(item: Item, prediction: str) -> bool:
    from vlserve.builtin.answers import is_correct

    if item.qtype == "relation":
        return relation_correct(prediction, item.answer)
    if item.qtype == "video" and item.answer.endswith(("shape.", "circle.", "square.", "triangle.")):
        return is_correct("shape", prediction, item.answer)
    return is_correct("caption" if item.qtype == "caption" else "colour", prediction, item.answer)
