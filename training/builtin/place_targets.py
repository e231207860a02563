"""Training-only: a relation's two places, read linearly at the position that predicts its answer.

"Is the circle above the square?" needs both shapes' places where the answer is predicted. Linear
probes on the sixth stage's residual stream there (`python -m training.builtin.probe_relations`) read
the asked-about shape's place after the retrieval layer (R² 0.7-0.9) and the reference shape's nowhere
(R² < 0), although a head attended to it: its values carried what the shape is, not where. So for a
relation measured from a named shape, a linear head on the residual after `PLACE_LAYER`, at the
answer's first prediction, is trained to give both visible centres (x, y as fractions of the view);
its loss reaches the reference heads' values and the layers below. Like the attention targets, nothing
of it is saved: the checkpoint stays a plain LLaVA model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from training.builtin.attention_targets import RETRIEVAL_LAYER
from vlserve.builtin import scenes

PLACE_LAYER = RETRIEVAL_LAYER  # the residual after this decoder layer holds both places
UNIFORM_VARIANCE = 1 / 12  # of a centre uniform on [0, 1]: the loss is 1 for a head that knows nothing


@dataclass
class PlaceTarget:
    query: int  # the position that predicts the answer's first token
    places: tuple[float, float, float, float]  # (x, y) of the asked-about shape, then of the reference


def turn_places(scene: scenes.Scene, qa: scenes.QA, query: int) -> list[PlaceTarget]:
    """The place target of one turn: only a relation measured from a named shape has one."""
    if qa.ref is None or qa.about is None:
        return []
    centres = scenes.centroids(scene.masks[0], len(scene.objects[0]))
    return [PlaceTarget(query, (*centres[qa.about], *centres[qa.ref]))]


@dataclass
class PlaceBatch:
    """Every place target of a batch: entry i asks the head to read places[i] from the residual of
    sequence row[i] at position query[i]."""

    row: torch.Tensor
    query: torch.Tensor
    places: torch.Tensor  # [N, 4]

    @classmethod
    def build(cls, per_row: list[list[PlaceTarget]]) -> "PlaceBatch":
        flat = [(r, t) for r, ts in enumerate(per_row) for t in ts]
        return cls(torch.tensor([r for r, _ in flat], dtype=torch.long),
                   torch.tensor([t.query for _, t in flat], dtype=torch.long),
                   torch.tensor([t.places for _, t in flat], dtype=torch.float32).reshape(-1, 4))

    def loss(self, hidden: torch.Tensor, head: "PlaceHead") -> torch.Tensor:
        """Mean squared error over the four coordinates, over a uniform centre's variance (0 when the
        batch has no relation measured from a named shape)."""
        if len(self.row) == 0:
            return hidden.new_zeros(())
        predicted = head(hidden[self.row, self.query])
        return ((predicted - self.places) ** 2).mean() / UNIFORM_VARIANCE


class PlaceHead(nn.Module):
    """The linear read-out: residual -> (x, y) of the asked-about shape, (x, y) of the reference. The
    residual is normalised first (its scale grows through the layers) and the read-out starts at the
    middle of the view, so the loss starts near 1 and its first gradients do not swamp the answer's
    (a plain linear head started at a loss of ~200 and set a pilot's positions back by 20 points)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden, elementwise_affine=False)
        self.linear = nn.Linear(hidden, 4)
        nn.init.zeros_(self.linear.weight)
        nn.init.constant_(self.linear.bias, 0.5)

    def forward(self, residual: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(residual))
