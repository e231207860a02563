"""Per-request media options (issue 48): media_io_kwargs / mm_processor_kwargs with vLLM's names, the
/generate and /upload aliases, validation by name, and what the options change: the frames and pixels
the model sees, so the token counts and the radix keys."""


import numpy as np
import pytest

from helpers.server_helpers import data_uri, metric_values, png
from vlserve.bench.workload_defs import lossless_mkv
from vlserve.preprocess import MediaOptionError, MediaOptions, VideoSampling


def lossless_video(seed: int, n: int, rate: int = 4, size: int = 32) -> bytes:
    """n random frames at `rate` fps; ffv1, so equal frames decode to equal pixels."""
    rng = np.random.default_rng(seed)
    return lossless_mkv([rng.integers(0, 255, (size, size, 3), dtype=np.uint8) for _ in range(n)], rate)


# ---- the rules ----------------------------------------------------------------------------------

def test_fps_takes_fixed_timestamps_so_a_longer_clip_starts_with_the_same_frames():
    by_fps = VideoSampling(fps=2)
    short, long = by_fps.indices(total=12, source_fps=6), by_fps.indices(total=30, source_fps=6)
    assert short == [0, 3, 6, 9] and long[:4] == short and len(long) == 10


def test_max_frames_thins_the_fps_grid_and_caps_num_frames():
    grid = VideoSampling(fps=2).indices(total=60, source_fps=6)
    capped = VideoSampling(fps=2, max_frames=8).indices(total=60, source_fps=6)
    assert len(capped) <= 8 and set(capped) <= set(grid) and capped[0] == 0 and capped[-1] >= 45
    assert VideoSampling(num_frames=3).indices(total=9, source_fps=6) == [0, 4, 8]
    assert VideoSampling(num_frames=10, max_frames=3).indices(total=9, source_fps=6) == [0, 4, 8]


@pytest.mark.parametrize("kwargs, param", [
    ({"video_num_frames": -1}, "video_num_frames"),
    ({"video_num_frames": True}, "video_num_frames"),
    ({"video_fps": float("nan")}, "video_fps"),
    ({"media_io_kwargs": {"video": {"num_frames": 0}}}, "media_io_kwargs.video.num_frames"),
    ({"media_io_kwargs": {"video": {"fps": -2}}}, "media_io_kwargs.video.fps"),
    ({"media_io_kwargs": {"video": {"max_frames": 2.5}}}, "media_io_kwargs.video.max_frames"),
    ({"media_io_kwargs": {"video": {"frames": 3}}}, "media_io_kwargs.video.frames"),
    ({"media_io_kwargs": {"audio": {}}}, "media_io_kwargs.audio"),
    ({"media_io_kwargs": {"video": {"num_frames": 2, "fps": 1}}}, "media_io_kwargs.video"),
    ({"media_io_kwargs": {"video": {"num_frames": 2}}, "video_num_frames": 3}, "video_num_frames"),
    ({"mm_processor_kwargs": {"max_pixels": [1]}}, "mm_processor_kwargs.max_pixels"),
])
def test_every_bad_value_is_refused_by_name(kwargs, param):
    with pytest.raises(MediaOptionError) as e:
        MediaOptions.parse(**kwargs)
    assert e.value.param == param and param.split(".")[-1] in str(e.value)


def test_aliases_and_vllm_names_are_one_rule():
    assert (MediaOptions.parse(video_num_frames=3)
            == MediaOptions.parse(media_io_kwargs={"video": {"num_frames": 3}})
            == MediaOptions.parse(media_io_kwargs={"video": {"num_frames": 3}}, video_num_frames=3))


# ---- through the server --------------------------------------------------------------------------

def _generate(http, **body):
    r = http.post("/generate", json={"sampling_params": {"max_new_tokens": 1}, **body})
    return r.status_code, r.json()


def test_generate_refuses_bad_options_with_a_400_naming_them(http):
    video = data_uri(lossless_video(1, 4), "video/x-matroska")
    for body, param in [({"video_num_frames": -1}, "video_num_frames"),
                        ({"media_io_kwargs": {"video": {"fps": 0}}}, "media_io_kwargs"),
                        ({"mm_processor_kwargs": {"max_pixels": 1000}}, "mm_processor_kwargs.max_pixels")]:
        status, out = _generate(http, text="<video>\nWhat?", video_data=video, **body)
        assert status == 400, (body, out)
        assert param in (out["error"]["param"] or "") or param in out["error"]["message"], out


def test_num_frames_changes_the_token_count_and_shares_only_equal_frames(server, http):
    tpi = server[0].loaded.config.tokens_per_image
    video = data_uri(lossless_video(2, 9), "video/x-matroska")
    _, two = _generate(http, text="<video>\nWhat?", video_data=video, media_io_kwargs={"video": {"num_frames": 2}})
    _, three = _generate(http, text="<video>\nWhat?", video_data=video, video_num_frames=3)
    assert three["meta_info"]["prompt_tokens"] - two["meta_info"]["prompt_tokens"] == tpi
    # frames 0 and 8 against 0, 4 and 8: only frame 0 (and what precedes it) is the same prefix
    assert tpi <= three["meta_info"]["cached_tokens"] < 2 * tpi


def test_fps_sampling_of_a_growing_clip_reuses_the_earlier_frames(server, http):
    tpi = server[0].loaded.config.tokens_per_image
    frames = {"media_io_kwargs": {"video": {"fps": 2, "max_frames": 16}}}
    _, short = _generate(http, text="<video>\nNow?", video_data=data_uri(lossless_video(3, 8), "video/x-matroska"),
                         **frames)
    reused_before = _frames_reused(http)
    _, long = _generate(http, text="<video>\nNow?", video_data=data_uri(lossless_video(3, 16), "video/x-matroska"),
                        **frames)
    assert short["meta_info"]["prompt_tokens"] >= 4 * tpi and long["meta_info"]["prompt_tokens"] >= 8 * tpi
    assert long["meta_info"]["cached_tokens"] >= 4 * tpi  # the short clip's 4 frames, the same timestamps
    # and those 4 frames were not decoded again: the same packets (preprocess/video_packets.py)
    assert _frames_reused(http) - reused_before == 4


def _frames_reused(http) -> float:
    return sum(metric_values(http.get("/metrics").text, "vlserve_media_frames_reused_total").values())


def test_mm_processor_kwargs_change_the_pixels_and_so_the_keys(server, http):
    image = data_uri(png(seed=41))
    _, plain = _generate(http, text="<image>\nWhat?", image_data=image)
    _, again = _generate(http, text="<image>\nWhat?", image_data=image)
    _, nearest = _generate(http, text="<image>\nWhat?", image_data=image, mm_processor_kwargs={"resample": 0})
    assert again["meta_info"]["cached_tokens"] == again["meta_info"]["prompt_tokens"] - 1
    assert nearest["meta_info"]["cached_tokens"] < server[0].loaded.config.tokens_per_image
    for bad in (9, "bicubic", 2.5):
        status, out = _generate(http, text="<image>\nWhat?", image_data=image, mm_processor_kwargs={"resample": bad})
        assert status == 400 and "resample" in out["error"]["message"], out


def test_chat_route_takes_media_io_kwargs(server, http):
    tpi = server[0].loaded.config.tokens_per_image
    video = data_uri(lossless_video(4, 8), "video/x-matroska")
    message = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": video}},
                                            {"type": "text", "text": "What happens?"}]}]
    counts = []
    for n in (2, 5):
        r = http.post("/v1/chat/completions", json={"messages": message, "max_tokens": 1,
                                                     "media_io_kwargs": {"video": {"num_frames": n}}})
        assert r.status_code == 200, r.text
        counts.append(r.json()["usage"]["prompt_tokens"])
    assert counts[1] - counts[0] == 3 * tpi
    r = http.post("/v1/chat/completions", json={"messages": message, "max_tokens": 1,
                                                 "mm_processor_kwargs": {"min_pixels": 4}})
    assert r.status_code == 400 and "mm_processor_kwargs.min_pixels" in r.json()["error"]["message"]


def test_upload_takes_the_same_video_options(server, http):
    tpi = server[0].loaded.config.tokens_per_image
    files = {"video": ("clip.mkv", lossless_video(6, 12), "video/x-matroska")}
    counts = []
    for form in ({"fps": "2"}, {"fps": "2", "max_frames": "3"}):
        r = http.post("/upload", files=files, data={"prompt": "What?", "max_new_tokens": "1", **form})
        assert r.status_code == 200, r.text
        counts.append(r.json()["meta_info"]["prompt_tokens"])
    assert counts[0] - counts[1] == 3 * tpi  # 6 frames at 2 fps of a 3 s clip, thinned to every 2nd: 3
    r = http.post("/upload", files=files, data={"prompt": "What?", "num_frames": "-1"})
    assert r.status_code == 400 and "num_frames" in r.text
