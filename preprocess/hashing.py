"""Content hashes of processed pixels, and the pseudo-token ids that stand for an image's placeholder positions.

Pseudo-token ids live in [2**62, 2**63): far above any real vocabulary id, and int64-safe. Two
requests with the same image get the same ids (so they share a radix-cache prefix); two different
images collide only with probability ~n * 2**-62 per position pair.
"""

import functools

import numpy as np
import xxhash

PSEUDO_TOKEN_MIN = 2**62
PSEUDO_TOKEN_END = 2**63  # exclusive


def content_hash(pixels: np.ndarray, image_size: tuple[int, int] | None = None, role: str = "image") -> bytes:
    """xxh3_128 (16 bytes) of the float32 C-contiguous pixels, prefixed by their shape (and by the
    original image size where the model's features depend on it, as anyres unpadding does, and by a
    video frame's role where a model treats the last frame differently)."""
    pixels = np.ascontiguousarray(pixels, dtype=np.float32)
    digest = xxhash.xxh3_128()
    # The shape goes in too, so a [3, 2, 8] and a [3, 4, 4] array with the same bytes differ.
    digest.update(np.asarray(pixels.shape, dtype=np.int64).tobytes())
    if image_size is not None:
        digest.update(b"size" + np.asarray(image_size, dtype=np.int64).tobytes())
    if role != "image":  # a video frame whose features depend on its place in the video
        digest.update(b"role" + role.encode())
    digest.update(memoryview(pixels).cast("B"))
    return digest.digest()


def pad_values(image_hash: bytes, n: int) -> list[int]:
    """The n pseudo-token ids for an image's n placeholder positions: xxh3_64(hash + position), top bit set to 2**62."""
    if len(image_hash) != 16:
        raise ValueError(f"image_hash must be 16 bytes (xxh3_128), got {len(image_hash)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return list(_pad_values(image_hash, n))


@functools.lru_cache(maxsize=512)  # a follow-up about the same picture reuses them (256-2,880 ids each)
def _pad_values(image_hash: bytes, n: int) -> tuple[int, ...]:
    return tuple(PSEUDO_TOKEN_MIN | (xxhash.xxh3_64_intdigest(image_hash + i.to_bytes(8, "little")) >> 2)
                 for i in range(n))


def is_pseudo_token(token_id: int) -> bool:
    return PSEUDO_TOKEN_MIN <= token_id < PSEUDO_TOKEN_END
