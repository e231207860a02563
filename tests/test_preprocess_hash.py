"""Content hashes and pseudo-token pad values (vlserve.preprocess)."""

import base64
import io

import numpy as np
import pytest
from PIL import Image

from vlserve.preprocess import (
    PSEUDO_TOKEN_MIN,
    ImageProcessing,
    MediaLimits,
    content_hash,
    is_pseudo_token,
    pad_values,
    prepare_image,
)

PROCESSING = ImageProcessing.from_hf_config({"size": {"shortest_edge": 24}, "crop_size": 24})


def png(picture: Image.Image) -> bytes:
    buf = io.BytesIO()
    picture.save(buf, "PNG")
    return buf.getvalue()


def noise(seed: int, size=(30, 20)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def test_same_picture_via_bytes_data_uri_base64_and_path_hashes_equal(tmp_path):
    data = png(noise(1))
    (tmp_path / "p.png").write_bytes(data)
    b64 = base64.b64encode(data).decode()
    limits = MediaLimits(allowed_media_path=str(tmp_path))
    sources = [data, f"data:image/png;base64,{b64}", b64, str(tmp_path / "p.png"), tmp_path / "p.png"]
    hashes = {prepare_image(s, PROCESSING, limits).content_hash for s in sources}
    assert len(hashes) == 1
    # Another encoding of the same pixels (lossless) hashes the same too: the hash is of pixels, not bytes.
    buf = io.BytesIO()
    noise(1).save(buf, "BMP")
    assert prepare_image(buf.getvalue(), PROCESSING).content_hash in hashes


def test_different_picture_of_the_same_size_hashes_and_pads_differently():
    first, second = prepare_image(png(noise(1)), PROCESSING), prepare_image(png(noise(2)), PROCESSING)
    assert first.pixel_values.shape == second.pixel_values.shape
    assert first.content_hash != second.content_hash
    pads_first, pads_second = pad_values(first.content_hash, 64), pad_values(second.content_hash, 64)
    assert not set(pads_first) & set(pads_second)


def test_one_pixel_changed_changes_the_hash():
    picture = noise(3)
    changed = picture.copy()
    r, g, b = changed.getpixel((15, 10))
    changed.putpixel((15, 10), ((r + 128) % 256, g, b))
    assert prepare_image(png(picture), PROCESSING).content_hash != prepare_image(png(changed), PROCESSING).content_hash


def test_content_hash_is_over_float32_c_contiguous_pixels_and_shape():
    pixels = np.random.default_rng(0).standard_normal((3, 4, 6)).astype(np.float32)
    digest = content_hash(pixels)
    assert len(digest) == 16
    assert content_hash(np.asfortranarray(pixels)) == digest  # layout does not matter, values do
    assert content_hash(pixels.astype(np.float64)) == digest  # hashed as float32
    assert content_hash(pixels.reshape(3, 6, 4)) != digest  # same bytes, other shape
    bumped = pixels.copy()
    bumped[0, 0, 0] = np.nextafter(bumped[0, 0, 0], np.float32(np.inf))
    assert content_hash(bumped) != digest


def test_pad_values_are_pseudo_tokens_per_position_and_deterministic():
    digest = prepare_image(png(noise(4)), PROCESSING).content_hash
    pads = pad_values(digest, 576)
    assert len(pads) == 576 and len(set(pads)) == 576
    assert all(PSEUDO_TOKEN_MIN <= p < 2**63 and is_pseudo_token(p) for p in pads)
    assert np.array(pads, dtype=np.int64).tolist() == pads  # int64-safe
    assert pad_values(digest, 576) == pads
    assert pad_values(digest, 10) == pads[:10]  # position i's id depends only on (hash, i)
    assert pad_values(digest, 0) == []


def test_pad_values_spread_over_the_whole_pseudo_token_range():
    """The collision bound (~n * 2**-62) needs all 62 free bits used: both halves of [2**62, 2**63)
    are hit. Catches a shift that drops one more bit (values only in the lower half); with 576
    positions that happens by chance with probability 2**-576."""
    pads = pad_values(bytes(range(16)), 576)
    middle = PSEUDO_TOKEN_MIN + 2**61
    assert any(p < middle for p in pads) and any(p >= middle for p in pads)


def test_is_pseudo_token_bounds():
    assert not is_pseudo_token(0)
    assert not is_pseudo_token(128_000)
    assert not is_pseudo_token(PSEUDO_TOKEN_MIN - 1)
    assert is_pseudo_token(PSEUDO_TOKEN_MIN)
    assert is_pseudo_token(2**63 - 1)
    assert not is_pseudo_token(2**63)


def test_pad_values_validate_arguments():
    with pytest.raises(ValueError, match="16 bytes"):
        pad_values(b"short", 4)
    with pytest.raises(ValueError, match="n must be >= 0"):
        pad_values(bytes(16), -1)
