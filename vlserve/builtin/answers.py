"""Whether an answer to a scene question (scenes.py) is right: it equals the reference after
normalisation (case, final full stop, a leading article or "on/at/in the", number words, "color",
"center"); a caption is right when it names every shape with its colour, as many times as it is
there ("two red circles" counts two), and names no shape that is not there.

The batch jobs and benchmarks (vlserve/bench) report the built-in model's accuracy with it, as the
evaluation harness (training/builtin/evaluate.py) does.
"""

import re
from collections import Counter

from vlserve.builtin import scenes

_NUMBERS = {word: str(n) for n, word in scenes.NUMBER_WORDS.items()} | {"zero": "0", "no": "0"}
_PAIR = re.compile(r"\b(?:(a|an|" + "|".join(list(scenes.NUMBER_WORDS.values())[1:]) + r")\s+)?("
                   + "|".join(scenes.COLOURS) + r")\s+("
                   + "|".join(scenes.SHAPES) + r")s?\b")
_FILLER = re.compile(r"^(?:(?:it is|it's|there (?:is|are)|on the|at the|in the|an|a)\s+)+")
_CANNOT_TELL = scenes.CANNOT_TELL.lower().rstrip(".")


def normalise(text: str) -> str:
    text = text.strip().lower().replace("color", "colour").replace("center", "centre")
    text = re.sub(r"\s+", " ", text).rstrip(".!")
    if text != _CANNOT_TELL:
        text = _FILLER.sub("", text)
    return _NUMBERS.get(text, text)


def caption_pairs(text: str) -> Counter:
    """(colour, shape) -> how many the text names."""
    out: Counter = Counter()
    for number, colour, shape in _PAIR.findall(text.strip().lower()):
        out[(colour, shape)] += int(_NUMBERS.get(number, "1"))
    return out


def is_correct(qtype: str, prediction: str, reference: str) -> bool:
    if qtype == "caption":
        return caption_pairs(prediction) == caption_pairs(reference)
    return normalise(prediction) == normalise(reference)
