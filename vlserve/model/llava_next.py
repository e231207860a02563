"""LLaVA-NeXT's image features: the base view, then the tiles' features stitched into one map,
unpadded to the image's aspect ratio, with an `image_newline` embedding closing every row.

How many tokens an image takes depends on its size (`ModelConfig.image_tokens`); the count and the
features come from the same geometry (preprocess.anyres), so the placeholder rows and the
embeddings always line up.
"""

import torch
from torch import nn

from vlserve.model.vision import VisionEncoder
from vlserve.model.anyres_layout import AnyresLayout


class AnyresVisionEncoder(VisionEncoder):
    """Every view of every image through the tower in one batch, then each image's features packed."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.image_newline = nn.Parameter(torch.empty(cfg.text.hidden_size))

    @torch.inference_mode()
    def encode(self, pixel_values: list[torch.Tensor], image_sizes: list[tuple[int, int]]) -> list[torch.Tensor]:
        views = self(torch.cat(pixel_values))  # [all views, tokens_per_image, hidden]
        per_image = views.split([p.shape[0] for p in pixel_values])
        return [self._pack(v, size) for v, size in zip(per_image, image_sizes)]

    def _pack(self, views: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        layout: AnyresLayout = self.cfg.anyres
        base, tiles = views[0], views[1:]
        rows, cols = layout.grid(image_size)
        side, hidden = layout.side, views.shape[-1]
        # [rows*cols tiles, side*side, hidden] -> one [rows*side, cols*side, hidden] map, tile by tile
        fmap = tiles.reshape(rows, cols, side, side, hidden).permute(0, 2, 1, 3, 4).reshape(rows * side, cols * side, hidden)
        keep_rows, keep_cols = layout.kept(image_size)
        fmap = fmap[keep_rows, keep_cols]
        newline = self.image_newline.to(fmap.dtype).expand(fmap.shape[0], 1, hidden)
        return torch.cat((base, torch.cat((fmap, newline), dim=1).reshape(-1, hidden)))
