"""How people type a question: one generated question rewritten the ways users write it.

The scene generator's templates are whole sentences; typed questions are often shorter, lower-case or
shouting, without a question mark, with a filler word in front or behind. `retype` rewrites a question
at random in those ways, keeping every word that carries its meaning (a colour, a shape, a relation),
so the answer stays the same. `parts` recombines a question from a head, a linking phrase and the thing
asked about, so that a type of question is asked in many more word orders than a template list holds.
"""

from __future__ import annotations

import random

PREFIXES = ("", "", "", "", "hey, ", "ok, ", "so ", "quick question: ", "please tell me: ", "um, ", "and ",
            "now: ", "question: ")
SUFFIXES = ("", "", "", "", " please", " here", " in the picture", " in this image", " in the drawing", " then",
            " exactly", " now")
CONTRACTIONS = (("What is", "What's"), ("what is", "what's"), ("Where is", "Where's"), ("where is", "where's"),
                ("Which is", "Which's"), ("There is", "There's"))


def retype(question: str, rng: random.Random) -> str:
    """The question as someone might type it: contraction, filler, casing and punctuation at random."""
    q = question.strip()
    end = q[-1] if q[-1] in "?." else ""
    body = q[:-1] if end else q
    if rng.random() < 0.3:
        for full, short in CONTRACTIONS:
            if body.startswith(full):
                body = short + body[len(full):]
                break
    if rng.random() < 0.3:
        prefix = rng.choice(PREFIXES)
        body = prefix + (body[0].lower() + body[1:] if prefix else body)
    suffix = rng.choice(SUFFIXES) if rng.random() < 0.25 else ""
    if suffix.strip() not in body:
        body += suffix
    casing = rng.random()
    if casing < 0.3:
        body = body.lower()
    elif casing < 0.36:
        body = body.upper()
    elif body[0].islower() and casing < 0.7:
        body = body[0].upper() + body[1:]
    mark = rng.random()
    if mark < 0.3:
        end = ""
    elif mark < 0.34:
        end = "??"
    elif mark < 0.38:
        end = " ?"
    elif mark < 0.42 and end == "?":
        end = "?!"
    return body + end


def parts(rng: random.Random, heads: tuple[str, ...], links: tuple[str, ...], thing: str) -> str:
    """A head ("what colour"), a link ("is the {}", "of the {}") and the thing asked about, joined;
    the mark at the end is left to `retype`."""
    return f"{rng.choice(heads)} {rng.choice(links).format(thing)}".strip() + "?"
