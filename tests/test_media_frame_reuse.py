"""A grown clip decodes only its new frames: frames are reused by the chain of compressed packets
they decode from (preprocess/video_packets.py, frame_cache.py, video_reuse.py), exactly."""

import numpy as np
import pytest
from test_preprocess_video import CONTAINERS, encode_video

from vlserve.preprocess import ImageProcessing, PooledVideoProcessing, prepare_video
from vlserve.preprocess.frame_cache import FrameCache

PROCESSING = ImageProcessing(shortest_edge=16, crop_size=(16, 16))


def noise(n: int, seed: int = 5) -> list[np.ndarray]:
    """No two frames alike, so a frame taken from the wrong packet shows in its hash."""
    return list(np.random.default_rng(seed).integers(0, 256, (n, 24, 32, 3), dtype=np.uint8))


def hashes(images) -> list[bytes]:
    return [image.content_hash for image in images]


@pytest.mark.parametrize("name,muxer,codec,pix_fmt", CONTAINERS, ids=[c[0] for c in CONTAINERS])
def test_with_a_frame_cache_every_container_gives_the_frames_of_a_decode_from_the_start(name, muxer, codec, pix_fmt):
    reused = []
    cache = FrameCache(on_reuse=reused.append)
    frames = noise(30)
    for n in (20, 30):  # the second clip grows the first
        clip = encode_video(frames[:n], muxer, codec, pix_fmt)
        for sampling in ({"num_frames": 7}, {"fps": 2.5}):
            assert hashes(prepare_video(clip, PROCESSING, **sampling, frame_cache=cache)) == \
                hashes(prepare_video(clip, PROCESSING, **sampling)), (n, sampling)
    if codec == "ffv1":  # lossless and deterministic: a grown clip's packets repeat the first clip's
        assert sum(reused) > 0


def test_a_grown_ffv1_clip_decodes_and_processes_only_its_new_frames():
    reused = []
    cache = FrameCache(on_reuse=reused.append)
    frames = noise(60, seed=6)  # 10 fps: 1 fps sampling takes frames 0, 10, 20, ...; keyframes every 12
    first = prepare_video(encode_video(frames[:40], "matroska", "ffv1"), PROCESSING, fps=1.0, frame_cache=cache)
    grown = prepare_video(encode_video(frames[:60], "matroska", "ffv1"), PROCESSING, fps=1.0, frame_cache=cache)
    assert len(first) == 4 and len(grown) == 6 and reused == [4]  # frames 0..30 again; 40 and 50 are new
    assert hashes(grown[:4]) == hashes(first)
    assert all(a is b for a, b in zip(grown, first))  # the very ProcessedImages (pixel keys included)


def test_a_pooled_videos_last_frame_keeps_its_role_when_the_clip_grows():
    pooled = PooledVideoProcessing(PROCESSING)
    cache = FrameCache()
    frames = noise(40, seed=7)
    first = prepare_video(encode_video(frames[:30], "matroska", "ffv1"), pooled, fps=1.0, frame_cache=cache)
    grown = prepare_video(encode_video(frames, "matroska", "ffv1"), pooled, fps=1.0, frame_cache=cache)
    assert [f.role for f in first] == ["frame", "frame", "last_frame"]
    assert [f.role for f in grown] == ["frame", "frame", "frame", "last_frame"]
    assert hashes(grown) == hashes(prepare_video(encode_video(frames, "matroska", "ffv1"), pooled, fps=1.0))


def test_the_frame_cache_is_an_lru_bounded_by_bytes():
    images = prepare_video(encode_video(noise(12), "matroska", "ffv1"), PROCESSING, num_frames=3)
    size = images[0].pixel_values.nbytes
    cache = FrameCache(max_bytes=2 * size)
    for i, image in enumerate(images):
        cache.put_processed(PROCESSING, bytes([i]) * 16, "image", image)
    assert len(cache) == 2 and cache.num_bytes == 2 * size
    assert cache.processed(PROCESSING, bytes([0]) * 16, "image") is None  # the oldest went
    assert cache.processed(PROCESSING, bytes([2]) * 16, "image") is images[2]
