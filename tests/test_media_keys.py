"""Images and video frames as pseudo-token keys, seen through the engine (issue: multimodal keys)."""

import base64
import io

import numpy as np
import pytest
from PIL import Image

from vlserve import Engine
from vlserve.bench.workload_defs import lossless_mkv
from vlserve.testing.tiny import make_tiny_model


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = make_tiny_model(str(tmp_path_factory.mktemp("keys")), seed=2)
    media_dir = tmp_path_factory.mktemp("media")
    with Engine(path, max_total_tokens=8192, allowed_media_path=str(media_dir), video_frames=6) as e:
        e.media_dir = media_dir
        yield e


def _frames(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for _ in range(n)]


def _video(frames: list[np.ndarray]) -> bytes:
    return lossless_mkv(frames, fps=4)  # lossless: equal input frames decode to equal pixels


def test_videos_sharing_their_first_frames_share_those_frames_kv(engine):
    common = _frames(1, 3)
    a, b = _video(common + _frames(2, 3)), _video(common + _frames(3, 3))
    tpi = engine.loaded.config.tokens_per_image
    first = engine.generate(prompt="<video>\nWhat happens?", video_data=a, sampling_params={"max_new_tokens": 2})
    second = engine.generate(prompt="<video>\nWhat happens?", video_data=b, sampling_params={"max_new_tokens": 2})
    assert first["meta_info"]["prompt_tokens"] >= 6 * tpi
    cached = second["meta_info"]["cached_tokens"]
    assert 3 * tpi <= cached < 4 * tpi + 2  # exactly the three shared frames (plus BOS), not the fourth
    engine.wait_idle()
    engine.scheduler.cm.check_idle_accounting()


def test_same_picture_as_bytes_data_uri_base64_and_path_hits(engine):
    img = Image.fromarray(_frames(7, 1)[0])
    buf = io.BytesIO()
    img.save(buf, "PNG")
    raw = buf.getvalue()
    (engine.media_dir / "pic.png").write_bytes(raw)
    b64 = base64.b64encode(raw).decode()
    prompt = "<image>\nDescribe it."
    tpi = engine.loaded.config.tokens_per_image
    first = engine.generate(prompt=prompt, image_data=raw, sampling_params={"max_new_tokens": 1})
    assert first["meta_info"]["cached_tokens"] < tpi
    for source in (f"data:image/png;base64,{b64}", b64, str(engine.media_dir / "pic.png")):
        out = engine.generate(prompt=prompt, image_data=source, sampling_params={"max_new_tokens": 1})
        assert out["meta_info"]["cached_tokens"] == out["meta_info"]["prompt_tokens"] - 1, source[:30]


def test_pil_images_are_accepted_and_hash_like_their_bytes(engine):
    img = Image.fromarray(_frames(9, 1)[0])
    buf = io.BytesIO()
    img.save(buf, "PNG")
    a = engine.make_request(prompt="<image>\nWhat?", image_data=[img])
    b = engine.make_request(prompt="<image>\nWhat?", image_data=buf.getvalue())
    assert a.input_ids == b.input_ids
