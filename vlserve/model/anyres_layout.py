"""How many tokens an anyres image takes, and which of its tiles' features it keeps: the geometry of
preprocess.anyres seen from the model's side (features instead of pixels)."""

from dataclasses import dataclass

from vlserve.preprocess.anyres import grid_shape, unpadded_slice


@dataclass(frozen=True)
class AnyresLayout:
    grid_pinpoints: tuple[tuple[int, int], ...]
    tile_size: int  # pixels per tile side (the tower's image_size)
    side: int  # features per tile side (image_size // patch_size)

    def grid(self, image_size: tuple[int, int]) -> tuple[int, int]:
        return grid_shape(image_size, self.grid_pinpoints, self.tile_size)

    def kept(self, image_size: tuple[int, int]) -> tuple[slice, slice]:
        """Rows and columns of the stitched tiles' feature map that show the image."""
        rows, cols = self.grid(image_size)
        return unpadded_slice(image_size, rows * self.side, cols * self.side)

    def tile_tokens(self, image_size: tuple[int, int]) -> int:
        """Tokens after the base view's: the kept feature rows, each closed by a newline."""
        rows, cols = self.kept(image_size)
        return (rows.stop - rows.start) * (cols.stop - cols.start + 1)
