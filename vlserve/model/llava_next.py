"""Anyres image features (LLaVA-NeXT, OneVision): the base view, then the tiles' features stitched
into one map, unpadded to the image's aspect ratio (OneVision: scaled down past anyres_max tiles),
with an `image_newline` embedding closing every row; and OneVision's pooled video frames.

How many tokens an image takes depends on its size and views (`ModelConfig.image_tokens`); the
count and the features come from the same geometry (model/anyres_layout.py over preprocess.anyres),
so the placeholder rows and the embeddings always line up.
"""

import torch
from torch import nn
from torch.nn import functional as F

from vlserve.model.anyres_layout import AnyresLayout
from vlserve.model.vision import VisionEncoder


class AnyresVisionEncoder(VisionEncoder):
    """Every view of every image through the tower in one batch, then each image's features packed."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.image_newline = nn.Parameter(torch.empty(cfg.text.hidden_size))

    @torch.inference_mode()
    def encode(self, pixel_values: list[torch.Tensor], image_sizes: list, roles: list[str] | None = None
               ) -> list[torch.Tensor]:
        views = [p if p.dim() == 4 else p[None] for p in pixel_values]
        tower = self.tower_features(torch.cat(views)).split([v.shape[0] for v in views])
        roles = roles or ["image"] * len(views)
        if self.cfg.anyres.frame_pool is not None:  # NeXT-Video pools frames before the projector
            tower = [self._pool_before_projector(t) if role != "image" else t for t, role in zip(tower, roles)]
        feats = [self.multi_modal_projector(t) for t in tower]  # per image [views, tokens, hidden]
        return [self._features(f, size, role) for f, size, role in zip(feats, image_sizes, roles)]

    def _features(self, views: torch.Tensor, image_size, role: str) -> torch.Tensor:
        layout: AnyresLayout = self.cfg.anyres
        if role != "image" and layout.frame_pool is not None:
            return views[0]  # pooled already
        if role != "image" and layout.pooled_video:
            return self._pooled_frame(views[0], closes_video=role == "last_frame")
        if views.shape[0] == 1:
            return torch.cat((views[0], self._newline(views, 1))) if layout.single_view_newline else views[0]
        return torch.cat((views[0], self._tiles(views[1:], image_size)))

    def _tiles(self, tiles: torch.Tensor, image_size) -> torch.Tensor:
        layout: AnyresLayout = self.cfg.anyres
        rows, cols = layout.grid(image_size)
        side, hidden = layout.side, tiles.shape[-1]
        # [rows*cols tiles, side*side, hidden] -> one [rows*side, cols*side, hidden] map, tile by tile
        fmap = (tiles.reshape(rows, cols, side, side, hidden).permute(0, 2, 1, 3, 4)
                .reshape(rows * side, cols * side, hidden))
        keep_rows, keep_cols = layout.kept(image_size)
        fmap = fmap[keep_rows, keep_cols]
        height, width = layout.tile_map_size(image_size)
        if (height, width) != fmap.shape[:2]:  # anyres_max: bilinear, as transformers scales it
            fmap = F.interpolate(fmap.permute(2, 0, 1)[None], [height, width], mode="bilinear")[0].permute(1, 2, 0)
        return torch.cat((fmap, self._newline(fmap, height)[:, None]), dim=1).reshape(-1, hidden)

    def _pooled_frame(self, frame: torch.Tensor, closes_video: bool) -> torch.Tensor:
        """OneVision: a frame's [side*side, hidden] features bilinearly pooled to ceil(side/2) squared."""
        layout: AnyresLayout = self.cfg.anyres
        side, hidden = layout.side, frame.shape[-1]
        grid = frame.reshape(side, side, hidden).permute(2, 0, 1)[None]
        pooled = F.interpolate(grid, [layout.pooled_side] * 2, mode="bilinear")[0].permute(1, 2, 0).reshape(-1, hidden)
        return torch.cat((pooled, self._newline(pooled, 1))) if closes_video else pooled

    def _pool_before_projector(self, frame: torch.Tensor) -> torch.Tensor:
        """NeXT-Video: a frame's [1, side*side, vision hidden] tower features, average- or max-pooled."""
        layout: AnyresLayout = self.cfg.anyres
        mode, stride = layout.frame_pool
        side, hidden = layout.side, frame.shape[-1]
        grid = frame.reshape(1, side, side, hidden).permute(0, 3, 1, 2)
        pool = F.avg_pool2d if mode == "average" else F.max_pool2d
        return pool(grid, stride, stride).flatten(2).transpose(1, 2)

    def _newline(self, like: torch.Tensor, n: int) -> torch.Tensor:
        return self.image_newline.to(like.dtype).expand(n, like.shape[-1])
