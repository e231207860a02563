"""Training-only attention supervision for the built-in model: where an answer should look.

Trained on answers alone, the small decoder learns *that* the image matters but not *which* patches
answer "what colour is the square?" among two or three shapes, nor which frame of a video came first
(pilots and the first committed run: 55% on colour-of-a-named-shape, 46% on direction, while a probe
on the projector's output read shape and colour per patch at 99%). So training tells two heads of
one decoder layer where to look, as a loss on their attention probabilities:

- retrieval heads (layer `RETRIEVAL_LAYER`), at the position that predicts the answer: the patches of
  the shape the question names (a yes/no question about a shape that is there included); for a
  caption, each kind of shape's patches while its words are written; for counting and for a picture
  with no known shape, every patch alike (their mean keeps a count of the per-patch "a shape's centre
  is here" features the auxiliary head teaches); in a video, the shape in the frames of the asked-for
  colour (first/last) or in all its frames (which shape), and for what happens and the direction of
  motion the first frame (head A) and the last frame (head B): the shape there, or the whole frame
  where it is absent;
- a keyword head (layer `KEYWORD_LAYER`), at the same position: the question's words that name a
  shape, a colour, or the start or end of the video, so the retrieval query knows what it is after;
- reference heads (head `REFERENCE_HEAD`, the other KV group, in layer `KEYWORD_LAYER` and in layer
  `RETRIEVAL_LAYER`), for a relation measured from a named shape ("what is above the square?", "is the
  circle left of the square?"): that shape's patches, so the retrieval heads, and the answer, have its
  place to compare with. The layer-2 one brings it in the layer where the asked-about shape's place
  arrives; what its values must carry is taught by place_targets.py.

Nothing of this is saved: the checkpoint is a plain LLaVA model whose attention was trained this way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

from vlserve.builtin import scenes

RETRIEVAL_LAYER = 2
RETRIEVAL_HEADS = (0, 1)  # (A, B): the same patches, except first frame / last frame for direction
KEYWORD_LAYER = 1
KEYWORD_HEAD = 0
REFERENCE_HEAD = 3  # layer KEYWORD_LAYER, the other KV group: a relation's reference shape
# ... and the same head number in the retrieval layer, the KV group beside the retrieval heads, so that
# the reference shape's place arrives in the layer where the asked-about shape's does
REFERENCE_HEADS = ((KEYWORD_LAYER, REFERENCE_HEAD), (RETRIEVAL_LAYER, REFERENCE_HEAD))
KEYWORDS = re.compile(r"\b(" + "|".join([*scenes.SHAPES, *scenes.COLOURS, "start", "beginning", "first",
                                         "end", "last"]) + r")s?\b")
NUMBERS = "|".join(f"[{w[0].upper()}{w[0]}]{w[1:]}" for w in list(scenes.NUMBER_WORDS.values())[2:])  # Two|...
MIN_COVER = 1 / 8  # a patch belongs to a shape that covers this fraction of it


@dataclass
class AttentionTarget:
    layer: int
    head: int
    query: int  # position whose attention is supervised (it predicts the next token)
    keys: list[int]  # positions whose attention probabilities should sum to one


@dataclass
class Turn:
    """Where one tokenized question/answer turn sits in its sequence."""

    prompt: str  # the chat-templated prompt text of this turn
    prompt_offsets: list[tuple[int, int]]  # per prompt token (image runs expanded), chars in `prompt`
    prompt_start: int  # position of the turn's first prompt token
    answer_offsets: list[tuple[int, int]]  # per answer token, chars in answer_prefix + answer + eos
    answer_start: int  # position of the first answer token
    answer_prefix: str = ""  # " " when the prompt ends "ASSISTANT:" (a raw prompt), else ""


def object_patches(scene: scenes.Scene, grid: int) -> list[list[list[int]]]:
    """Per frame, per object: the patch indices it covers (at least its most-covered patch)."""
    out = []
    for mask, objects in zip(scene.masks, scene.objects):
        blocks = scenes.patch_blocks(mask, grid)
        per_object = []  # empty for a frame without shapes
        for k in range(1, len(objects) + 1):
            cover = (blocks == k).mean(1)
            hit = np.flatnonzero(cover >= MIN_COVER)
            per_object.append(hit.tolist() if len(hit) else [int(cover.argmax())])
        out.append(per_object)
    return out


def retrieval_patches(scene: scenes.Scene, qa: scenes.QA, grid: int) -> tuple[list[int], list[int]] | None:
    """(head A, head B) targets as indices into the scene's image tokens (frame * grid² + patch), or
    None where no place answers the question (a yes/no question about a shape that is not there)."""
    patches = object_patches(scene, grid)
    n = grid * grid

    def tokens(frames: list[int], obj: int = 0) -> list[int]:
        return [f * n + p for f in frames if patches[f] for p in patches[f][obj]]

    def shape_or_frame(f: int) -> list[int]:
        return tokens([f]) or list(range(f * n, (f + 1) * n))

    frames = range(len(scene.frames))
    colours = [objs[0].colour if objs else None for objs in scene.objects]
    if qa.about is not None:
        t = tokens([0], qa.about)
        return t, t
    if qa.qtype in ("count", scenes.OUTSIDE_QTYPE):
        every = list(range(n))
        return every, every
    if qa.qtype in ("first_colour", "last_colour"):
        present = [c for c in colours if c is not None]
        want = present[0] if qa.qtype == "first_colour" else present[-1]
        t = tokens([f for f in frames if colours[f] == want])
        return t, t
    if qa.qtype == "appears":
        t = tokens(list(frames))
        return t, t
    if qa.qtype in ("direction", "event"):
        return shape_or_frame(0), shape_or_frame(len(scene.frames) - 1)
    return None


def caption_phrases(scene: scenes.Scene, caption: str) -> list[tuple[int, int, list[int]]]:
    """(start, end, object indices) of each "a red circle" / "two red circles" in a caption."""
    shapes = scene.objects[0]
    centres = scenes.centroids(scene.masks[0], len(shapes))
    out = []
    for colour, shape, ks in scenes.caption_groups(shapes, centres):
        m = re.search(rf"\b(?:[Aa]n?|{NUMBERS}) {colour} {shape}s?\b", caption)
        if m:
            out.append((m.start(), m.end(), ks))
    return out


def overlapping(offsets: list[tuple[int, int]], start: int, end: int) -> list[int]:
    """Indices of the tokens whose character span overlaps [start, end)."""
    return [i for i, (a, b) in enumerate(offsets) if a < end and b > start and b > a]


def keyword_spans(question: str) -> list[tuple[int, int]]:
    return [m.span() for m in KEYWORDS.finditer(question.lower())]


def turn_targets(scene: scenes.Scene, qa: scenes.QA, turn: Turn, image_positions: list[int],
                 grid: int) -> list[AttentionTarget]:
    """Every attention target of one turn; `image_positions` are the sequence's image tokens."""
    query = turn.answer_start - 1  # predicts the first answer token
    out = []
    if qa.qtype == "caption":
        patches = object_patches(scene, grid)[0]
        shift = len(turn.answer_prefix)
        for start, end, ks in caption_phrases(scene, qa.answer):
            keys = sorted({image_positions[p] for k in ks for p in patches[k]})
            for t in overlapping(turn.answer_offsets, start + shift, end + shift):
                out += [AttentionTarget(RETRIEVAL_LAYER, h, turn.answer_start + t - 1, keys) for h in RETRIEVAL_HEADS]
        return out
    patches = retrieval_patches(scene, qa, grid)
    if patches is not None:
        for head, ps in zip(RETRIEVAL_HEADS, patches):
            out.append(AttentionTarget(RETRIEVAL_LAYER, head, query, [image_positions[p] for p in ps]))
    if qa.ref is not None:
        keys = [image_positions[p] for p in object_patches(scene, grid)[0][qa.ref]]
        out += [AttentionTarget(layer, head, query, keys) for layer, head in REFERENCE_HEADS]
    q_at = turn.prompt.rfind(qa.question)
    words = [i for a, b in keyword_spans(qa.question) for i in overlapping(turn.prompt_offsets, q_at + a, q_at + b)]
    if words:
        out.append(AttentionTarget(KEYWORD_LAYER, KEYWORD_HEAD, query, [turn.prompt_start + i for i in words]))
    return out


@dataclass
class AttentionBatch:
    """All attention targets of a batch as index tensors: entry i supervises
    attention[layer[i]][row[i], head[i], query[i], :] to put its mass on keys[i] (a 0/1 row)."""

    layer: torch.Tensor
    row: torch.Tensor
    head: torch.Tensor
    query: torch.Tensor
    keys: torch.Tensor  # [N, T]

    @classmethod
    def build(cls, per_row: list[list[AttentionTarget]], T: int) -> "AttentionBatch":
        flat = [(r, t) for r, ts in enumerate(per_row) for t in ts]
        keys = torch.zeros((len(flat), T))
        for i, (_, t) in enumerate(flat):
            keys[i, t.keys] = 1.0
        col = lambda f: torch.tensor([f(r, t) for r, t in flat], dtype=torch.long)  # noqa: E731
        return cls(col(lambda r, t: t.layer), col(lambda r, t: r), col(lambda r, t: t.head),
                   col(lambda r, t: t.query), keys)

    def loss(self, attentions: dict[int, torch.Tensor]) -> torch.Tensor:
        """Mean over entries of -log(attention mass on the target keys)."""
        total, n = torch.zeros(()), 0
        for layer, probs in attentions.items():
            sel = self.layer == layer
            if not sel.any():
                continue
            p = probs[self.row[sel], self.head[sel], self.query[sel]]  # [n, T]
            mass = (p * self.keys[sel]).sum(-1)
            total = total - torch.log(mass.clamp_min(1e-6)).sum()
            n += int(sel.sum())
        return total / max(n, 1)
