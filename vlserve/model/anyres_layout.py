"""How many tokens an anyres image takes, and which of its tiles' features it keeps: the geometry of
preprocess.anyres seen from the model's side (features instead of pixels)."""

import math
from dataclasses import dataclass

from vlserve.preprocess.anyres import grid_shape, unpadded_slice


@dataclass(frozen=True)
class AnyresLayout:
    grid_pinpoints: tuple[tuple[int, int], ...]
    tile_size: int  # pixels per tile side (the tower's image_size)
    side: int  # features per tile side (image_size // patch_size)
    max_tiles: int | None = None  # OneVision's anyres_max_N: features scaled down past N tiles' worth
    single_view_newline: bool = False  # OneVision: an untiled image (one of several) ends with a newline
    pooled_video: bool = False  # OneVision: each frame's features pooled 2x2, one newline after the last
    # NeXT-Video: each frame's tower features pooled (average / max, this stride) before the projector
    frame_pool: tuple[str, int] | None = None

    def grid(self, image_size: tuple[int, int]) -> tuple[int, int]:
        return grid_shape(image_size, self.grid_pinpoints, self.tile_size)

    def kept(self, image_size: tuple[int, int]) -> tuple[slice, slice]:
        """Rows and columns of the stitched tiles' feature map that show the image."""
        rows, cols = self.grid(image_size)
        return unpadded_slice(image_size, rows * self.side, cols * self.side)

    def tile_tokens(self, image_size: tuple[int, int]) -> int:
        """Tokens after the base view's: the kept feature rows, each closed by a newline."""
        height, width = self.tile_map_size(image_size)
        return height * (width + 1)

    def tile_map_size(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """(rows, columns) of the tiles' feature map after unpadding and, past max_tiles, scaling down."""
        rows, cols = self.kept(image_size)
        height, width = rows.stop - rows.start, cols.stop - cols.start
        ratio = self.downscale(height, width)
        return (int(height // ratio), int(width // ratio)) if ratio > 1.1 else (height, width)

    def downscale(self, height: int, width: int) -> float:
        """anyres_max_N: by how much a height x width feature map exceeds N tiles (scaled when > 1.1)."""
        if self.max_tiles is None:
            return 1.0
        return math.sqrt(height * width / (self.max_tiles * self.side ** 2))

    @property
    def pooled_side(self) -> int:
        """Features per side of a pooled video frame."""
        if self.frame_pool is not None:
            return self.side // self.frame_pool[1]
        return math.ceil(self.side / 2)
