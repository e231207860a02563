"""What preprocessing hands to tokenization: model-ready pixels, their content hash, the original size."""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ProcessedImage:
    # float32, C-contiguous: [3, H, W] for one view (LLaVA-1.5, video frames), or [V, 3, H, W] for
    # anyres (the base view, then the tiles row by row)
    pixel_values: np.ndarray
    content_hash: bytes  # 16 bytes, xxh3_128 of pixel_values (and of image_size where it is set)
    image_size: tuple[int, int] | None = None  # (height, width) before processing, where the model needs it
    # "image"; or, for models that pool video frames and close a video with one newline (OneVision,
    # NeXT-Video), "frame" / "last_frame" -- the role is hashed in, so a frame never shares keys with a picture
    role: str = "image"
