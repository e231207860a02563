"""ProcessedImageCache (preprocess/image_cache.py): bytes already seen skip decoding and processing,
with the same result as prepare_image; bounded by bytes, LRU, keyed by config and pixel limit."""

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from vlserve.bench.workload_defs import video_mp4
from vlserve.preprocess import ImageProcessing, MediaError, MediaLimits, prepare_image, prepare_video
from vlserve.preprocess import image_cache
from vlserve.preprocess.image_cache import ProcessedImageCache

PROCESSING = ImageProcessing(shortest_edge=32, crop_size=(32, 32))
ENTRY_BYTES = 3 * 32 * 32 * 4


def png(seed: int, size=(48, 40)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture
def decodes(monkeypatch):
    """Counts real decodes behind the cache."""
    calls = []
    real = image_cache.decode_image
    monkeypatch.setattr(image_cache, "decode_image", lambda data, limits: calls.append(len(data)) or real(data, limits))
    return calls


def test_a_repeat_skips_decoding_and_returns_the_same_result(decodes):
    cache = ProcessedImageCache()
    data = png(0)
    first = cache.prepare_image(data, PROCESSING)
    again = cache.prepare_image(data, PROCESSING)
    assert len(decodes) == 1 and (cache.hits, cache.misses) == (1, 1)
    assert again is first
    expected = prepare_image(data, PROCESSING)
    assert first.content_hash == expected.content_hash
    assert np.array_equal(first.pixel_values, expected.pixel_values)
    assert not first.pixel_values.flags.writeable  # shared by every hit: nobody may change it


def test_the_same_bytes_in_another_encoding_hit(decodes):
    cache = ProcessedImageCache()
    data = png(1)
    cache.prepare_image(data, PROCESSING)
    cache.prepare_image(base64.b64encode(data).decode(), PROCESSING)
    cache.prepare_image("data:image/png;base64," + base64.b64encode(data).decode(), PROCESSING)
    assert len(decodes) == 1 and cache.hits == 2


def test_other_bytes_or_another_config_miss(decodes):
    cache = ProcessedImageCache()
    a = cache.prepare_image(png(2), PROCESSING)
    b = cache.prepare_image(png(3), PROCESSING)
    c = cache.prepare_image(png(2), ImageProcessing(shortest_edge=16, crop_size=(16, 16)))
    assert len(decodes) == 3 and cache.hits == 0
    assert a.content_hash != b.content_hash and c.pixel_values.shape == (3, 16, 16)


def test_a_stricter_pixel_limit_is_not_dodged_by_a_hit():
    cache = ProcessedImageCache()
    data = png(4, size=(48, 40))
    cache.prepare_image(data, PROCESSING)
    with pytest.raises(MediaError, match="max_image_pixels"):
        cache.prepare_image(data, PROCESSING, MediaLimits(max_image_pixels=100))


def test_bounded_by_bytes_least_recently_used_out(decodes):
    cache = ProcessedImageCache(max_bytes=2 * ENTRY_BYTES)
    images = [png(10 + i) for i in range(3)]
    cache.prepare_image(images[0], PROCESSING)
    cache.prepare_image(images[1], PROCESSING)
    cache.prepare_image(images[0], PROCESSING)  # 0 is now the most recent; 1 goes first
    cache.prepare_image(images[2], PROCESSING)
    assert len(cache) == 2 and cache.num_bytes == 2 * ENTRY_BYTES
    decodes.clear()
    cache.prepare_image(images[0], PROCESSING)
    cache.prepare_image(images[2], PROCESSING)
    assert decodes == []
    cache.prepare_image(images[1], PROCESSING)
    assert len(decodes) == 1 and cache.num_bytes <= cache.max_bytes


def test_zero_budget_caches_nothing(decodes):
    cache = ProcessedImageCache(max_bytes=0)
    data = png(20)
    cache.prepare_image(data, PROCESSING)
    cache.prepare_image(data, PROCESSING)
    assert len(decodes) == 2 and len(cache) == 0


def test_pil_images_are_processed_every_time():
    cache = ProcessedImageCache()
    image = Image.open(io.BytesIO(png(21)))
    assert cache.prepare_image(image, PROCESSING).content_hash == prepare_image(png(21), PROCESSING).content_hash
    assert len(cache) == 0


def test_concurrent_callers_agree_and_the_bound_holds():
    cache = ProcessedImageCache(max_bytes=3 * ENTRY_BYTES)
    sources = [png(30 + i % 5) for i in range(60)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda s: cache.prepare_image(s, PROCESSING), sources))
    for source, result in zip(sources, results):
        assert result.content_hash == prepare_image(source, PROCESSING).content_hash
    assert len(cache) <= 3 and cache.num_bytes <= cache.max_bytes
    assert cache.hits + cache.misses == len(sources)


@pytest.fixture
def video_decodes(monkeypatch):
    """Counts real video decodes behind the cache."""
    calls = []
    real = image_cache.prepare_video
    monkeypatch.setattr(image_cache, "prepare_video", lambda data, *a: calls.append(len(data)) or real(data, *a))
    return calls


def test_a_repeated_video_skips_decoding_with_the_same_frames(video_decodes):
    cache = ProcessedImageCache()
    clip = video_mp4(0, frames=6, size=48)
    first = cache.prepare_video(clip, PROCESSING, num_frames=4)
    again = cache.prepare_video(base64.b64encode(clip).decode(), PROCESSING, num_frames=4)
    assert len(video_decodes) == 1 and (cache.hits, cache.misses) == (1, 1)
    expected = prepare_video(clip, PROCESSING, num_frames=4)
    assert [f.content_hash for f in again] == [f.content_hash for f in first] == [f.content_hash for f in expected]
    assert len(first) == 4 and len({f.content_hash for f in first}) == 4  # four different frames, in order
    assert cache.num_bytes == 4 * ENTRY_BYTES
    again.pop()  # a caller's list is its own: the cached frames stay whole
    assert len(cache.prepare_video(clip, PROCESSING, num_frames=4)) == 4


def test_other_frame_sampling_or_limits_miss_a_cached_video(video_decodes):
    cache = ProcessedImageCache()
    clip = video_mp4(1, frames=6, size=48)
    cache.prepare_video(clip, PROCESSING, num_frames=4)
    assert len(cache.prepare_video(clip, PROCESSING, num_frames=2)) == 2
    with pytest.raises(MediaError, match="video_max_frames"):
        cache.prepare_video(clip, PROCESSING, MediaLimits(video_max_frames=3), num_frames=4)
    assert len(video_decodes) == 3 and cache.hits == 0  # the stricter limit missed, and its decode raised


def test_videos_and_images_share_one_byte_budget(video_decodes):
    cache = ProcessedImageCache(max_bytes=5 * ENTRY_BYTES)
    cache.prepare_video(video_mp4(2, frames=6, size=48), PROCESSING, num_frames=4)
    cache.prepare_image(png(40), PROCESSING)
    cache.prepare_image(png(41), PROCESSING)  # 6 entries' bytes > 5: the video, least recent, goes
    assert len(cache) == 2 and cache.num_bytes == 2 * ENTRY_BYTES
    cache.prepare_video(video_mp4(2, frames=6, size=48), PROCESSING, num_frames=4)
    assert len(video_decodes) == 2


def test_a_video_sampled_by_fps_is_keyed_by_its_fps(video_decodes):
    cache = ProcessedImageCache()
    clip = video_mp4(3, frames=8, size=48)  # 2 s at 4 fps
    two = cache.prepare_video(clip, PROCESSING, fps=2.0)
    one = cache.prepare_video(clip, PROCESSING, fps=1.0)
    assert (len(two), len(one)) == (4, 2) and len(video_decodes) == 2
    assert len(cache.prepare_video(clip, PROCESSING, fps=2.0)) == 4 and len(video_decodes) == 2


def test_an_oversized_video_is_refused_by_name_before_any_decode(video_decodes):
    with pytest.raises(MediaError, match="video has .* over the limit video_max_bytes"):
        ProcessedImageCache().prepare_video(video_mp4(4, frames=8, size=48), PROCESSING,
                                            MediaLimits(video_max_bytes=100), num_frames=4)
    assert video_decodes == []


def test_an_entry_the_size_of_the_budget_is_kept_and_a_replaced_entry_counted_once():
    cache = ProcessedImageCache(max_bytes=ENTRY_BYTES)
    image = cache.prepare_image(png(50), PROCESSING)
    assert len(cache) == 1 and cache.num_bytes == ENTRY_BYTES
    key = next(iter(cache._entries))
    cache.put(key, image)  # two threads that missed on the same bytes both put
    assert len(cache) == 1 and cache.num_bytes == ENTRY_BYTES


def test_oversized_images_are_refused_by_name_bytes_or_pixels():
    cache = ProcessedImageCache()
    with pytest.raises(MediaError, match="image has .* over the limit max_image_bytes"):
        cache.prepare_image(png(51), PROCESSING, MediaLimits(max_image_bytes=100))
    with pytest.raises(MediaError, match="max_image_pixels"):  # a PIL image is not cached, but still checked
        cache.prepare_image(Image.open(io.BytesIO(png(52))), PROCESSING, MediaLimits(max_image_pixels=100))
    assert len(cache) == 0


def test_a_negative_budget_is_refused_by_name():
    with pytest.raises(ValueError, match="max_bytes must be >= 0, got -1"):
        ProcessedImageCache(max_bytes=-1)
