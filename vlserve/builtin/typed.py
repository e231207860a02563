"""Scenes asked about the way people type (issue 49): the generator's world (scenes.py) widened.

On top of `scenes.image_scene`'s pictures and questions, a typed scene has
- crowded pictures: CROWDED_COUNTS (five or six) smaller shapes that may overlap more (each keeps
  CROWDED_VISIBLE of itself), and canvases of more sizes and aspect ratios; how often colours repeat among
  a picture's shapes is a PictureMix's choice;
- relation questions (qtype "relation"): what is above / below / left / right of a named shape, the
  shape at the top / bottom / furthest left / right, the biggest and the smallest, and yes/no
  "is the A above / left of the B"; each asked only where the picture gives one plain answer, read from
  the label mask (visible centres and areas); the answer names the shape ("A square.", with its colour
  when two shapes share a kind);
- counts of one colour ("how many red shapes?");
- questions from outside its world ("what breed is the dog?", "read the text"), answered with
  `scenes.CANNOT_TELL`, about drawn pictures and pictures with no known shape alike;
- every question rewritten as typed (phrasing.py): short forms built from parts or taken whole (the thing
  first: "circle colour?", "red shape?", "blue square?"; possessives: "the circle's colour", "on the
  square's left"; the verb or "is what" at the end), word order, casing, punctuation, a missing
  question mark;
- a short word written on some pictures (TEXT_SHARE): writing is not a shape and changes no answer.

The plain generator (`scenes.samples`) is unchanged, so its evaluation stays comparable across
checkpoints; `samples` here is this wider world's evaluation.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
from PIL import Image, ImageDraw

from vlserve.builtin import scenes
from vlserve.builtin.phrasing import parts, retype
from vlserve.builtin.scenes import QA, Scene, Shape

RELATION_QTYPE = "relation"
QTYPES = (*scenes.IMAGE_QTYPES, RELATION_QTYPE, scenes.OUTSIDE_QTYPE)
EXTRA_SIZES = ((240, 180), (180, 240), (256, 144), (144, 256), (200, 100), (100, 200), (224, 168), (320, 240),
               (400, 300), (300, 400), (480, 360), (600, 300), (300, 600), (640, 400), (360, 640), (512, 512))
CROWDED_SHARE = 0.4
# How many shapes a crowded picture has, drawn evenly. With (5, 6) alone, small shapes mean "five or
# six" and a count the vision reads weakly falls to five: four plain shapes are called five.
CROWDED_COUNTS = (5, 6)
TEXT_SHARE = 0.1  # of typed pictures: a word written on them in a neutral ink (text is not a shape)
WORDS = ("SALE", "hello", "OPEN", "STOP", "exit", "No. 7", "Hi!", "menu", "ABC", "12:30", "café", "EXIT 4")
CROWDED_VISIBLE = 0.55
# Of crowded (plain) pictures: colours drawn with repeats, so that several shapes share one. A model that
# sees few repeats counts colours, not shapes: two touching red shapes read as one.
CROWDED_REPEAT_SHARE = 0.4
PLAIN_REPEAT_SHARE = 0.25  # scenes._colours' default
FOREIGN_SHARE = 0.5  # of typed scenes: one question from outside the world among its questions
RETYPE_SHARE = 0.7  # of questions: rewritten as typed
MAX_RELATIONS = 3  # of a scene's relation questions, so that they do not crowd out the rest
GAP = 0.14  # fraction of the view by which one shape must be above / left of another to say so
SIZE_RATIO = 1.7  # how many times the biggest (smallest) shape's visible area must exceed (undercut) the next

# ---------------------------------------------------------------- short forms, from parts

COLOUR_HEADS = ("what colour", "what color", "which colour", "which color", "colour", "color", "what shade")
COLOUR_LINKS = ("is the {}", "of the {}", "for the {}", "does the {} have", "has the {}", "is that {}", "the {} is")
# Whole short forms the head-link joins do not make: the thing first, a possessive, a verb at the end.
COLOUR_FORMS = ("{} colour", "{} color", "{} colour please", "the {}'s colour", "the {}'s color", "{}'s colour",
                "what's the {}'s colour", "what is the {}'s color", "colour of {}", "the {}: what colour",
                "the {}: colour", "the {} is which colour", "the {} has which colour", "which colour has the {} got",
                "what colour has the {} got", "in what colour is the {} drawn", "in which color is the {} done",
                "what colour is the {} painted", "what colour was used for the {}",
                "what colour would you say the {} is",
                "what colour do you see on the {}", "tell me the {}'s colour", "say the colour of the {}",
                "{} - what colour", "colour: {}", "and the {}'s colour")
SHAPE_HEADS = ("what shape", "which shape", "what", "shape", "what kind of shape", "what sort of shape")
SHAPE_LINKS = ("is the {} one", "is {}", "is the {} thing", "is the {} object", "of the {} one", "has colour {}",
               "is in {}", "is coloured {}")
SHAPE_FORMS = ("{} shape", "{} one", "{} thing", "the {} one", "the {} one is a what", "the {} shape is what",
               "the {} thing is which shape", "{} figure", "which figure is {}", "what figure is {}",
               "what's the {} thing", "what is the {} item", "what is painted {}", "what is drawn in {}",
               "what's done in {}", "identify the {} shape", "name the {} one", "tell me what the {} shape is",
               "what kind of figure is the {} one", "what sort of thing is {}", "the {} figure is a",
               "the {} object: which shape", "shape of the {} one", "{}: which shape")
COUNT_HEADS = ("how many", "number of", "count the", "total number of")
COUNT_LINKS = ("{}", "{} are there", "{} do you see", "{} are drawn", "{} can you count", "{} in all")
COUNT_FORMS = ("{}: how many", "how many {} in total", "how many {} altogether", "what's the number of {}",
               "what is the total number of {}", "how many {} can be seen", "how many {} are in it",
               "how many {} does it have", "how many {} are in this drawing", "count all the {}", "number of {} here",
               "the number of {}", "how many {} have been drawn", "{} - how many", "tell me how many {} there are")
WHERE_HEADS = ("where is", "where's", "where", "position of", "where would I find", "in what part is",
               "location:")
WHERE_LINKS = ("the {}", "the {} located", "the {} placed", "the {} in the image", "the {} sitting")
WHERE_FORMS = ("whereabouts is the {}", "where has the {} been drawn", "where has the {} been put",
               "where can the {} be seen", "where can the {} be found", "the {} is where", "the {}: where",
               "where in the picture is the {}", "where in the image is the {}", "which part has the {}",
               "{} position", "{} location", "where's the {} drawn", "where is the {} drawn",
               "where did they put the {}",
               "the {} sits where", "tell me where the {} is", "where does the {} sit")
EXISTS_HEADS = ("is there", "any", "do you see", "is there any", "can I see", "does it contain", "got",
                "does this have")
EXISTS_LINKS = ("{}", "a {}", "a {} in it", "a {} anywhere", "a {} at all")
EXISTS_FORMS = ("{}", "a {}", "{} anywhere", "any {} here", "a {} in it", "is a {} there", "is a {} in the picture",
                "is a {} drawn", "does the picture have a {}", "does the image show a {}", "does it show a {}",
                "can you spot a {}", "can you find a {}", "do I see a {}", "do I see a {} here", "spot a {}",
                "have you got a {}", "is there a {} or not", "{} - yes or no", "a {} somewhere")
CAPTION_QS = ("what's there", "what do we have here", "describe", "describe everything", "what shapes are there",
              "list the shapes", "caption", "caption please", "what is drawn", "what does it show",
              "what's in the picture", "tell me what's drawn", "name every shape", "what's shown",
              "summarise the picture", "one-line description", "what's in it", "what is in it",
              "what does the picture show", "what does the image show", "what does the drawing contain",
              "describe it", "describe the drawing", "describe the picture", "sum up the image", "give me a caption",
              "a caption for this", "what is shown", "what does this contain", "what can be seen",
              "list what you see", "what's drawn there", "summarize the image in a sentence", "describe the shapes",
              "what is on the canvas", "what's on it", "which shapes are drawn")

# ---------------------------------------------------------------- relations, from parts

RELATION_HEADS = ("what is", "what's", "which shape is", "what shape is", "which one is", "name the shape",
                  "what lies", "which is", "what shape do you see")
RELATION_VERBS = ("", "", "", "sits ", "lies ", "is found ", "can be seen ", "is drawn ", "is placed ")
# "{}" is the shape named.
RELATIONS = {"above": ("above the {}", "over the {}", "on top of the {}", "higher than the {}", "up from the {}",
                       "directly above the {}", "atop the {}", "just over the {}"),
             "below": ("below the {}", "under the {}", "underneath the {}", "lower than the {}", "down from the {}",
                       "beneath the {}", "directly below the {}", "just under the {}"),
             "left": ("to the left of the {}", "left of the {}", "on the left of the {}", "at the left of the {}",
                      "on the {}'s left", "to the {}'s left", "at the {}'s left side", "left from the {}"),
             "right": ("to the right of the {}", "right of the {}", "on the right of the {}", "at the right of the {}",
                       "on the {}'s right", "to the {}'s right", "at the {}'s right side", "right from the {}")}
RELATION_TAILS = ("the shape {} is what", "the one {} is what", "the thing {}: which shape", "{}: which shape",
                  "and {}", "name what's {}")
EXTREMES = {"top": ("at the top", "highest", "nearest the top", "the top one", "uppermost", "topmost",
                    "the highest one", "top-most", "closest to the top"),
            "bottom": ("at the bottom", "lowest", "nearest the bottom", "the bottom one", "bottommost",
                       "the lowest one", "lowermost", "closest to the bottom"),
            "left": ("furthest left", "leftmost", "on the far left", "the left-most one", "farthest to the left",
                     "most to the left", "the one on the left end", "at the far left"),
            "right": ("furthest right", "rightmost", "on the far right", "farthest to the right", "most to the right",
                      "the right-most one", "at the far right"),
            "big": ("the biggest", "the largest", "biggest", "largest", "the biggest one", "the largest one",
                    "the hugest", "the most big", "of greatest size", "the big one"),
            "small": ("the smallest", "smallest", "the smallest one", "the littlest", "the tiniest", "tiniest",
                      "the least big", "of least size", "the little one")}
# One word for an extreme, for the trailing forms ("the topmost shape is what?").
EXTREME_WORDS = {"top": ("topmost", "highest", "uppermost", "top"), "bottom": ("lowest", "bottom", "bottommost"),
                 "left": ("leftmost", "left-most"), "right": ("rightmost", "right-most"),
                 "big": ("biggest", "largest", "hugest"), "small": ("smallest", "tiniest", "littlest")}
EXTREME_TAILS = ("the {} shape is what", "the {} one is what", "{} shape", "{} one", "the {} shape is which",
                 "which shape is {}", "which one's {}", "tell me the {} shape", "the {} figure?", "{}")
# "{a}" asked about, "{b}" the reference; the answer is Yes when a lies on the relation's side of b.
YESNO_RELATIONS = {"above": ("is the {a} above the {b}", "is the {a} over the {b}", "is the {a} higher than the {b}",
                             "is the {a} higher up than the {b}", "the {a} is above the {b}"),
                   "below": ("is the {a} below the {b}", "is the {a} under the {b}", "is the {a} lower than the {b}",
                             "is the {a} beneath the {b}", "the {a} is under the {b}"),
                   "left": ("is the {a} left of the {b}", "is the {a} to the left of the {b}",
                            "is the {a} on the left of the {b}", "is the {a} on the {b}'s left",
                            "is the {a} to the {b}'s left", "the {a} is left of the {b}"),
                   "right": ("is the {a} right of the {b}", "is the {a} to the right of the {b}",
                             "is the {a} on the {b}'s right", "is the {a} to the {b}'s right",
                             "the {a} is right of the {b}")}
YESNO_ENDS = ("?", "?", " or not?", ", yes or no?", "?")

# ---------------------------------------------------------------- outside its world, from parts

ANIMALS = ("dog", "cat", "horse", "bird", "cow", "fish", "rabbit", "puppy", "kitten", "lion", "duck")
PEOPLE = ("man", "woman", "child", "boy", "girl", "person", "lady", "baby", "player", "teacher")
THINGS = ("car", "bus", "house", "tree", "flower", "phone", "bottle", "chair", "laptop", "cup", "bike", "boat",
          "building", "mountain", "street", "table", "shoe", "hat", "clock", "flag", "map", "poster", "screen", "watch",
          "menu", "plate", "train", "plane", "window", "door")
WRITING = ("text", "words", "sign", "label", "caption text", "letters", "writing", "note", "title", "number plate")
ATTRIBUTES = {ANIMALS: ("breed", "species", "name", "age", "mood"),
              PEOPLE: ("name", "age", "job", "mood", "nationality"),
              THINGS: ("brand", "price", "model", "make", "size in metres")}
FOREIGN_FORMS = ("what {a} is the {n}", "what's the {n}'s {a}", "tell me the {n}'s {a}", "which {a} is this {n}",
                 "what is the {a} of the {n}", "guess the {n}'s {a}", "do you know the {a} of the {n}")
DOING_FORMS = ("what is the {n} doing", "what is the {n} holding", "what is the {n} wearing", "is the {n} happy",
               "why is the {n} there", "what is the {n} looking at", "where is the {n} going",
               "what colour is the {n}", "how many {n}s are there", "where is the {n}", "is there a {n}",
               "what does the {n} eat", "who owns the {n}")
WRITING_FORMS = ("read the {w}", "what does the {w} say", "transcribe the {w}", "translate the {w}",
                 "spell out the {w}", "what is written on the {w}", "copy the {w}", "what font is the {w} in",
                 "what language is the {w} in", "what does the {w} mean", "what's printed on the {w}",
                 "how many letters does the {w} have", "what word is on the {w}")
# "{c}" a category of thing in a photograph: "what animal is this?"
CATEGORIES = ("animal", "plant", "food", "dish", "brand", "sport", "instrument", "flag", "language", "city", "country",
              "building", "bird", "tree", "car", "dog", "fruit", "drink", "game", "film", "song", "place", "logo")
CATEGORY_FORMS = ("what {c} is this", "which {c} is shown", "what kind of {c} is it", "name the {c}",
                  "what {c} is in the picture", "which {c} do you see", "identify the {c}", "what {c} does it show")
GENERAL = ("who took this photo", "where was this taken", "what season is it", "what year is this from",
           "is it raining", "how hot is it", "who made this", "what movie is this", "who painted it",
           "what's the capital of France", "write a poem about it", "what time of day is it", "is this real",
           "what city is this", "what is the date today", "what does this mean", "how much is it worth",
           "who is that", "what country is this", "what is the man's name", "what is the weather",
           "what time is it", "what time does the clock show", "what is written here", "what does it say",
           "who is in this picture", "what is the person doing", "what song is playing", "is the food tasty",
           "how much does it cost", "how old is this", "what is the price", "is this person happy",
           "what's the text", "what is the name of this place", "what are they doing", "who is the artist")


def foreign_question(rng: random.Random) -> str:
    """A question no circle, square or triangle answers."""
    pick = rng.random()
    if pick < 0.25:
        group = rng.choice(list(ATTRIBUTES))
        q = rng.choice(FOREIGN_FORMS).format(a=rng.choice(ATTRIBUTES[group]), n=rng.choice(group))
    elif pick < 0.4:
        q = rng.choice(CATEGORY_FORMS).format(c=rng.choice(CATEGORIES))
    elif pick < 0.65:
        q = rng.choice(DOING_FORMS).format(n=rng.choice(ANIMALS + PEOPLE + THINGS))
    elif pick < 0.85:
        q = rng.choice(WRITING_FORMS).format(w=rng.choice(WRITING))
    else:
        q = rng.choice(GENERAL)
    return q[0].upper() + q[1:] + ("." if q.split()[0] in ("read", "tell", "transcribe", "translate", "spell", "copy",
                                                        "guess", "write", "name", "identify") else "?")


# ---------------------------------------------------------------- pictures


@dataclasses.dataclass(frozen=True)
class PictureMix:
    """How typed.py draws a picture's shapes."""
    crowded_share: float = CROWDED_SHARE  # of pictures: crowded (CROWDED_COUNTS smaller shapes)
    crowded_counts: tuple[int, ...] = CROWDED_COUNTS  # how many shapes a crowded picture has, drawn evenly
    crowded_repeat_share: float = CROWDED_REPEAT_SHARE  # of crowded pictures: colours drawn with repeats
    plain_repeat_share: float = PLAIN_REPEAT_SHARE  # of the other pictures (two shapes or more): the same


def crowded_shapes(rng: random.Random, counts: tuple[int, ...] = CROWDED_COUNTS,
                   repeat_share: float = CROWDED_REPEAT_SHARE) -> tuple[list[Shape], np.ndarray]:
    """`counts` (one of them) smaller shapes, each keeping CROWDED_VISIBLE of itself."""
    while True:
        n = rng.choice(counts)
        colours = scenes._colours(n, rng, repeat_share)
        shapes = []
        for colour in colours:
            size = rng.uniform(0.13, 0.3)
            h = size / 2 + 0.02
            shapes.append(Shape(rng.choice(scenes.SHAPES), colour, rng.uniform(h, 1 - h), rng.uniform(h, 1 - h), size))
        mask = scenes.label_mask(shapes)
        if all((mask == k + 1).sum() >= CROWDED_VISIBLE * scenes.shape_mask(s).sum() for k, s in enumerate(shapes)):
            return shapes, mask


def write_word(img: Image.Image, view: scenes.View, bg_name: str, rng: random.Random) -> None:
    """A short word in black or white ink somewhere in the view: writing is not a shape, so it changes
    no answer (the label mask leaves it out) and a question about it gets the "cannot tell" sentence."""
    ink = (10, 10, 10) if sum(scenes.BACKGROUNDS[bg_name]) > 380 else (245, 245, 245)
    x, y = view.to_pixels(rng.uniform(0.02, 0.6), rng.uniform(0.02, 0.85))
    ImageDraw.Draw(img).text((x, y), rng.choice(WORDS), fill=ink, font_size=max(8, view.side // rng.randint(7, 12)))


def _picture(rng: random.Random, mix: PictureMix) -> tuple[list[Shape], np.ndarray]:
    if rng.random() < mix.crowded_share:
        return crowded_shapes(rng, mix.crowded_counts, mix.crowded_repeat_share)
    while True:
        n = rng.choice((1, 2, 2, 3, 3, 4))
        placed = scenes.place_shapes(n, rng, scenes._colours(n, rng, mix.plain_repeat_share))
        if placed is not None:
            return placed


# ---------------------------------------------------------------- questions


def _names(shapes: list[Shape]) -> list[str | None]:
    """How each shape can be named alone: its kind if it is the only one, else colour and kind if that
    pair is unique, else None."""
    out = []
    for s in shapes:
        same_kind = sum(t.shape == s.shape for t in shapes)
        same_pair = sum((t.shape, t.colour) == (s.shape, s.colour) for t in shapes)
        out.append(s.shape if same_kind == 1 else f"{s.colour} {s.shape}" if same_pair == 1 else None)
    return out


def _answer(shapes: list[Shape], k: int) -> str:
    s = shapes[k]
    kinds_unique = len({t.shape for t in shapes}) == len(shapes)
    said = s.shape if kinds_unique else f"{s.colour} {s.shape}"
    if not kinds_unique and sum((t.shape, t.colour) == (s.shape, s.colour) for t in shapes) > 1:
        return ""
    return f"{scenes._cap(scenes._article(said))} {said}."


def relation_qas(shapes: list[Shape], centres, mask: np.ndarray, rng: random.Random,
                 size_ratio: float = SIZE_RATIO) -> list[QA]:
    """Every relation question the picture answers plainly (see the module docstring)."""
    n = len(shapes)
    if n < 2:
        return []
    names = _names(shapes)
    areas = [int((mask == k + 1).sum()) for k in range(n)]
    out: list[QA] = []

    def add(question: str, k: int, ref: int | None = None) -> None:
        answer = _answer(shapes, k)
        if answer:
            out.append(QA(question, answer, RELATION_QTYPE, about=k, ref=ref))

    for k in range(n):  # what is above / below / left / right of the shape named
        if names[k] is None:
            continue
        x, y = centres[k]
        others = [j for j in range(n) if j != k]
        for rel, axis, sign in (("above", 1, -1), ("below", 1, 1), ("left", 0, -1), ("right", 0, 1)):
            beyond = [j for j in others if sign * (centres[j][axis] - centres[k][axis]) > GAP]
            unclear = [j for j in others if abs(centres[j][axis] - centres[k][axis]) <= GAP]
            if len(beyond) == 1 and not unclear:
                where = rng.choice(RELATIONS[rel]).format(names[k])
                if rng.random() < 0.3:
                    add(rng.choice(RELATION_TAILS).format(where) + "?", beyond[0], ref=k)
                else:
                    add(f"{rng.choice(RELATION_HEADS)} {rng.choice(RELATION_VERBS)}{where}?", beyond[0], ref=k)
    for extreme, key, reverse, gap in (("top", lambda j: centres[j][1], False, GAP),
                                       ("bottom", lambda j: centres[j][1], True, GAP),
                                       ("left", lambda j: centres[j][0], False, GAP),
                                       ("right", lambda j: centres[j][0], True, GAP),
                                       ("big", lambda j: areas[j], True, None),
                                       ("small", lambda j: areas[j], False, None)):
        order = sorted(range(n), key=key, reverse=reverse)
        first, second = key(order[0]), key(order[1])
        plain = abs(first - second) > gap if gap is not None else max(first, second) > size_ratio * min(first, second)
        if plain:
            if rng.random() < 0.4:
                add(rng.choice(EXTREME_TAILS).format(rng.choice(EXTREME_WORDS[extreme])).rstrip("?") + "?", order[0])
            else:
                add(f"{rng.choice(RELATION_HEADS)} {rng.choice(EXTREMES[extreme])}?", order[0])
    named = [k for k in range(n) if names[k] is not None]
    if len(named) >= 2:  # yes/no: is the A above / below / left / right of the B
        a, b = rng.sample(named, 2)
        for axis, rels in ((1, ("above", "below")), (0, ("left", "right"))):
            d = centres[b][axis] - centres[a][axis]  # > 0: a is above / left of b
            if abs(d) > GAP:
                rel = rng.choice(rels)
                q = rng.choice(YESNO_RELATIONS[rel]).format(a=names[a], b=names[b]) + rng.choice(YESNO_ENDS)
                yes = d > 0 if rel in ("above", "left") else d < 0
                out.append(QA(q[0].upper() + q[1:], "Yes." if yes else "No.", RELATION_QTYPE, about=a, ref=b))
    return out


def _short(rng: random.Random, heads: tuple[str, ...], links: tuple[str, ...], forms: tuple[str, ...],
           thing: str) -> str:
    """A short question about `thing`: head and link joined, or one of the whole forms, half and half."""
    return parts(rng, heads, links, thing) if rng.random() < 0.5 else rng.choice(forms).format(thing) + "?"


def short_qas(shapes: list[Shape], centres, rng: random.Random) -> list[QA]:
    """One short question of each image type, recombined from parts or a whole short form (names as
    `_names`)."""
    names = _names(shapes)
    out: list[QA] = []
    by_kind = [k for k in range(len(shapes)) if sum(t.shape == shapes[k].shape for t in shapes) == 1]
    if by_kind:
        k = rng.choice(by_kind)
        out.append(QA(_short(rng, COLOUR_HEADS, COLOUR_LINKS, COLOUR_FORMS, shapes[k].shape),
                      f"{scenes._cap(shapes[k].colour)}.",
                      "colour", about=k))
    by_colour = [k for k in range(len(shapes)) if sum(t.colour == shapes[k].colour for t in shapes) == 1]
    if by_colour:
        k = rng.choice(by_colour)
        s = shapes[k]
        out.append(QA(_short(rng, SHAPE_HEADS, SHAPE_LINKS, SHAPE_FORMS, s.colour),
                      f"{scenes._cap(scenes._article(s.shape))} "
                      f"{s.shape}.", "shape", about=k))
    pick = rng.random()
    if pick < 0.4:
        noun = rng.choice(("shapes", "things", "objects", "figures"))
        q = rng.choice(("how many?", "how many", "count", "count them", "how many are there?", "number?",
                        "how many in all?", "total?", "count please", "how many do you see?",
                        _short(rng, COUNT_HEADS, COUNT_LINKS, COUNT_FORMS, noun),
                        _short(rng, COUNT_HEADS, COUNT_LINKS, COUNT_FORMS, noun)))
        n = len(shapes)
    elif pick < 0.7:
        kind = rng.choice(scenes.SHAPES)
        q, n = _short(rng, COUNT_HEADS, COUNT_LINKS, COUNT_FORMS, kind + "s"), sum(s.shape == kind for s in shapes)
    else:
        colour = rng.choice([s.colour for s in shapes] + list(scenes.COLOURS))
        noun = rng.choice(("shapes", "things", "ones", "objects"))
        q = _short(rng, COUNT_HEADS, COUNT_LINKS, COUNT_FORMS, f"{colour} {noun}")
        n = sum(s.colour == colour for s in shapes)
    out.append(QA(q, scenes.count_word(n), "count"))
    placed = [k for k in range(len(shapes)) if names[k] and scenes.horizontal(centres[k][0])
              and scenes.vertical(centres[k][1])]
    if placed:
        k = rng.choice(placed)
        out.append(QA(_short(rng, WHERE_HEADS, WHERE_LINKS, WHERE_FORMS, names[k]),
                      scenes.where_phrase(scenes.horizontal(centres[k][0]), scenes.vertical(centres[k][1])),
                      "position", about=k))
    if rng.random() < 0.5:
        k = rng.randrange(len(shapes))
        colour, kind, answer, about = shapes[k].colour, shapes[k].shape, "Yes.", k
    else:
        pairs = {(s.colour, s.shape) for s in shapes}
        colour, kind = rng.choice([(c, s) for c in scenes.COLOURS for s in scenes.SHAPES if (c, s) not in pairs])
        answer, about = "No.", None
    whole = rng.random() < 0.5
    link = rng.choice(EXISTS_FORMS if whole else EXISTS_LINKS)
    if "a {}" in link and colour[0] in "aeiou" and rng.random() < 0.8:  # people write "a orange" too
        link = link.replace("a {}", "an {}")
    q = link.format(f"{colour} {kind}") if whole else f"{rng.choice(EXISTS_HEADS)} {link.format(f'{colour} {kind}')}"
    out.append(QA(q.replace("any a ", "any ").replace("any an ", "any ") + "?", answer, "exists", about=about))
    out.append(QA(rng.choice(CAPTION_QS) + "?", scenes.caption_of(shapes, centres), "caption"))
    return out


def typed_scene(rng: random.Random, mix: PictureMix = PictureMix(), size_ratio: float = SIZE_RATIO) -> Scene:
    """A picture (crowded at times, on a canvas of any listed size) with the plain generator's
    questions, the short forms, relations, a colour count and, at times, a question from outside."""
    shapes, mask = _picture(rng, mix)
    view = scenes.View(*rng.choice(scenes.PICTURE_SIZES + EXTRA_SIZES))
    bg_kind, bg_name = rng.choice(scenes.BACKGROUND_KINDS), rng.choice(list(scenes.BACKGROUNDS))
    img = scenes.render(shapes, view, bg_kind, bg_name, rng)
    if rng.random() < TEXT_SHARE:
        write_word(img, view, bg_name, rng)
    centres = scenes.centroids(mask, len(shapes))
    qas = scenes._image_qas(shapes, centres, rng) + short_qas(shapes, centres, rng)
    relations = relation_qas(shapes, centres, mask, rng, size_ratio)
    qas += rng.sample(relations, min(MAX_RELATIONS, len(relations)))
    if rng.random() < FOREIGN_SHARE:
        qas.append(QA(foreign_question(rng), scenes.CANNOT_TELL, scenes.OUTSIDE_QTYPE))
    qas = [dataclasses.replace(qa, question=retype(qa.question, rng) if rng.random() < RETYPE_SHARE else qa.question)
           for qa in qas]
    return Scene([img], [mask], [shapes], bg_name, qas)


def typed_outside_scene(rng: random.Random) -> Scene:
    """A picture with no known shape, asked the plain questions and questions from outside, as typed."""
    scene = scenes.outside_scene(rng)
    qas = [QA(retype(foreign_question(rng) if rng.random() < 0.4 else qa.question, rng), qa.answer, qa.qtype)
           for qa in scene.qas]
    return Scene(scene.frames, scene.masks, scene.objects, scene.background, qas)


MOTION_VERBS = ("move", "go", "travel", "head", "run", "roll", "float", "fly", "slip", "sail", "creep", "zoom",
                "dash", "walk", "race", "hurry", "steer", "coast")
DIRECTION_FORMS = ("which way does the {s} {v}", "where does it {v}", "in which direction does the {s} {v}",
                   "which direction does it {v} in", "where does the {s} {v} to", "the {s} {v}s which way",
                   "{v} direction", "towards where does the {s} {v}", "which way", "direction?",
                   "what direction does the {s} {v} in", "the {s} {v}s where", "in what direction does it {v}",
                   "which way does it {v} off to")
EVENT_QS = ("what's happening", "what goes on", "what happens here", "what does it do", "what is the {s} up to",
            "what changes", "what happens over time", "summarise the video", "tell me what happens",
            "what is going on", "describe the clip", "describe the video", "describe the animation",
            "what does the {s} do here", "what does the {s} do in the clip", "what happens to it",
            "what happens to the {s}", "sum up the clip", "what is the {s} doing")
WHICH_QS = ("what shape shows up", "which shape is in the video", "what figure does the clip show", "which shape",
            "what is in the clip", "what shape is it", "which figure do you see in the clip", "what's in the video",
            "what kind of shape is in the animation", "name the shape in the clip")
COLOUR_AT = {"first_colour": ("what colour is the {s} at first", "the {s}'s colour at the start",
                              "initial colour of the {s}", "what colour does the {s} start as",
                              "what colour does it begin with", "starting colour", "first colour of the {s}"),
             "last_colour": ("what colour is the {s} in the end", "the {s}'s colour at the end",
                             "final colour of the {s}", "what colour does the {s} end as",
                             "what colour does it finish with", "ending colour", "last colour of the {s}")}


def typed_video_scene(rng: random.Random, n_frames: int | None = None) -> Scene:
    """A video with its plain questions and, as typed, direction and event questions with more verbs."""
    scene = scenes.video_scene(rng, n_frames)
    shape = scene.qas[0].answer.split()[-1].rstrip(".")
    qas = list(scene.qas)
    for qa in scene.qas:
        if qa.qtype == "direction":
            q = rng.choice(DIRECTION_FORMS).format(s=shape, v=rng.choice(MOTION_VERBS))
            qas.append(QA(q[0].upper() + q[1:].rstrip("?") + "?", qa.answer, qa.qtype))
        if qa.qtype == "event":
            qas.append(QA(rng.choice(EVENT_QS).format(s=shape).capitalize() + "?", qa.answer, qa.qtype))
        if qa.qtype == "appears":
            qas.append(QA(rng.choice(WHICH_QS).capitalize() + "?", qa.answer, qa.qtype))
        if qa.qtype in COLOUR_AT:
            qas.append(QA(rng.choice(COLOUR_AT[qa.qtype]).format(s=shape).capitalize() + "?", qa.answer, qa.qtype))
    qas = [QA(retype(qa.question, rng) if rng.random() < RETYPE_SHARE else qa.question, qa.answer, qa.qtype, qa.about)
           for qa in qas]
    return Scene(scene.frames, scene.masks, scene.objects, scene.background, qas)


def samples(n: int, seed: int) -> list[scenes.Sample]:
    """`n` questions of the typed world, types in equal shares (round-robin); "outside" alternates
    between drawn pictures and pictures with no known shape."""
    rng = random.Random(seed)
    out: list[scenes.Sample] = []
    while len(out) < n:
        want = QTYPES[len(out) % len(QTYPES)]
        scene = typed_outside_scene(rng) if want == scenes.OUTSIDE_QTYPE and rng.random() < 0.5 else typed_scene(rng)
        options = [qa for qa in scene.qas if qa.qtype == want]
        if options:
            qa = rng.choice(options)
            out.append(scenes.Sample(scene.frames, qa.question, qa.answer, qa.qtype))
    return out
