"""Video decoding and frame sampling with PyAV (vlserve.preprocess)."""

import base64
import io

import av
import numpy as np
import pytest

from vlserve.preprocess import (
    ImageProcessing,
    MediaError,
    MediaLimits,
    load_video,
    prepare_video,
    read_video,
    sample_indices,
)

RATE = 10  # frames per second of every generated video
WIDTH, HEIGHT = 32, 24

# (name, muxer, codec, pixel format): every container the pipeline accepts, with encoders the av wheel ships.
CONTAINERS = [
    ("mp4", "mp4", "mpeg4", "yuv420p"),
    ("mp4-h264", "mp4", "libx264", "yuv420p"),  # B-frames: packets arrive out of display order
    ("webm", "webm", "libvpx", "yuv420p"),
    ("mkv", "matroska", "ffv1", "yuv420p"),
    ("gif", "gif", "gif", "rgb8"),
]


def gray_frames(n: int) -> list[np.ndarray]:
    """Frame i is a flat gray of level 20*i, so a decoded frame tells which index it was."""
    return [np.full((HEIGHT, WIDTH, 3), 20 * i, dtype=np.uint8) for i in range(n)]


def encode_video(frames: list[np.ndarray], muxer: str = "mp4", codec: str = "mpeg4", pix_fmt: str = "yuv420p") -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format=muxer) as container:
        stream = container.add_stream(codec, rate=RATE)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, pix_fmt
        if codec == "mpeg4":
            stream.bit_rate = 4_000_000  # plenty for 32x24, so gray levels survive
        container.start_encoding()  # write the header even when there are no frames
        for pixels in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def levels(frames) -> list[int]:
    return [int(round(np.asarray(f, dtype=float).mean() / 20)) for f in frames]


@pytest.fixture(scope="module")
def videos() -> dict[str, bytes]:
    return {name: encode_video(gray_frames(12), muxer, codec, pix) for name, muxer, codec, pix in CONTAINERS}


@pytest.mark.parametrize("name", [c[0] for c in CONTAINERS])
def test_uniform_sampling_per_container(videos, name):
    sampled = read_video(videos[name], num_frames=4)
    assert sampled.info.total_frames == 12
    assert sampled.info.frame_indices == (0, 4, 7, 11)
    assert len(sampled.frames) == 4
    assert all(f.mode == "RGB" and f.size == (WIDTH, HEIGHT) for f in sampled.frames)
    assert levels(sampled.frames) == [0, 4, 7, 11]  # the right frames, decoded
    assert sampled.info.duration_s == pytest.approx(1.2, abs=0.11)
    assert sampled.info.source_fps == pytest.approx(RATE)


@pytest.mark.parametrize("name", [c[0] for c in CONTAINERS])
def test_fps_sampling_per_container(videos, name):
    sampled = read_video(videos[name], fps=2.5)  # one frame every 4 of a 10 fps video
    assert sampled.info.frame_indices == (0, 4, 8)
    assert levels(sampled.frames) == [0, 4, 8]
    assert len(load_video(videos[name], fps=RATE * 2)) == 12  # faster than the source: every frame once


def test_webm_and_mkv_frames_are_counted_mp4_comes_from_the_header(videos):
    assert read_video(videos["webm"], num_frames=2).info.frames_counted
    assert read_video(videos["mkv"], num_frames=2).info.frames_counted
    assert not read_video(videos["mp4"], num_frames=2).info.frames_counted
    info = read_video(videos["webm"], num_frames=2).info
    assert (info.container, info.codec) == ("matroska", "vp8")


def test_more_frames_asked_than_the_video_has_gives_all(videos):
    assert read_video(videos["mp4"], num_frames=40).info.frame_indices == tuple(range(12))


def test_default_sampling_is_eight_uniform_frames(videos):
    assert len(load_video(videos["mkv"])) == 8


def test_sample_indices():
    assert sample_indices(10, 30.0, 1, None) == [0]
    assert sample_indices(10, 30.0, 2, None) == [0, 9]
    assert sample_indices(100, 30.0, 5, None) == [0, 25, 50, 74, 99]
    assert sample_indices(100, 30.0, None, 1.0) == [0, 30, 60, 90]
    assert sample_indices(5, 30.0, None, 60.0) == [0, 1, 2, 3, 4]
    assert sample_indices(7, 10.0, None, 3.0) == [0, 3, 6]


def test_sources_data_uri_base64_and_allowed_path(videos, tmp_path):
    data = videos["mp4"]
    b64 = base64.b64encode(data).decode()
    (tmp_path / "clip.mp4").write_bytes(data)
    limits = MediaLimits(allowed_media_path=str(tmp_path))
    for source in [f"data:video/mp4;base64,{b64}", b64, "clip.mp4", tmp_path / "clip.mp4"]:
        assert levels(load_video(source, limits, num_frames=3)) == [0, 6, 11]
    with pytest.raises(MediaError, match="local video paths are disabled"):
        load_video(tmp_path / "clip.mp4")
    (tmp_path / "sub").mkdir()
    with pytest.raises(MediaError, match="outside allowed_media_path"):
        load_video("../clip.mp4", MediaLimits(allowed_media_path=str(tmp_path / "sub")))


def test_num_frames_and_fps_together_is_an_error(videos):
    with pytest.raises(MediaError, match=r"give either num_frames or fps, not both \(num_frames=4, fps=1.0\)"):
        load_video(videos["mp4"], num_frames=4, fps=1.0)
    with pytest.raises(MediaError, match="num_frames must be a positive integer"):
        load_video(videos["mp4"], num_frames=0)
    with pytest.raises(MediaError, match="fps must be a positive number"):
        load_video(videos["mp4"], fps=-1.0)


def test_frame_count_limit(videos):
    limits = MediaLimits(video_max_frames=4)
    with pytest.raises(MediaError, match=r"request has 5 frames \(num_frames\), over the limit video_max_frames=4"):
        load_video(videos["mp4"], limits, num_frames=5)
    with pytest.raises(MediaError, match=r"sampling fps=5.0 from a 1.200 s video has 6 frames, "
                                         r"over the limit video_max_frames=4"):
        load_video(videos["mp4"], limits, fps=5.0)
    assert len(load_video(videos["mp4"], limits, fps=2.5)) == 3


@pytest.mark.parametrize("name", ["mp4", "webm", "gif"])
def test_duration_limit(videos, name):
    with pytest.raises(MediaError, match=r"video has 1\.[12] seconds.*over the limit video_max_duration_s=1.0"):
        load_video(videos[name], MediaLimits(video_max_duration_s=1.0), num_frames=2)
    assert len(load_video(videos[name], MediaLimits(video_max_duration_s=1.2), num_frames=2)) == 2


def test_byte_and_frame_size_limits(videos):
    data = videos["mp4"]
    with pytest.raises(MediaError, match=rf"video has {len(data)} bytes, over the limit video_max_bytes=100"):
        load_video(data, MediaLimits(video_max_bytes=100))
    with pytest.raises(MediaError, match=r"video frame has 768 pixels, over the limit max_image_pixels=700 "
                                         r"\(size 32x24\)"):
        load_video(data, MediaLimits(max_image_pixels=700))


@pytest.mark.parametrize("name", ["mp4", "webm", "gif"])
def test_decode_budget_counts_every_frame_up_to_the_last_sampled_one(videos, name):
    """12 frames of 32x24: sampling up to the last decodes 9216 pixels; only the first, 768."""
    frame = WIDTH * HEIGHT
    with pytest.raises(MediaError, match=rf"decoding 12 frames of 32x24.* has {12 * frame} pixels, over the limit "
                                         rf"video_max_decoded_pixels={12 * frame - 1}"):
        load_video(videos[name], MediaLimits(video_max_decoded_pixels=12 * frame - 1), num_frames=2)
    assert len(load_video(videos[name], MediaLimits(video_max_decoded_pixels=12 * frame), num_frames=2)) == 2
    assert len(load_video(videos[name], MediaLimits(video_max_decoded_pixels=frame), num_frames=1)) == 1


def test_corrupt_empty_and_undecodable_videos_are_clear_errors(videos):
    with pytest.raises(MediaError, match="video is empty"):
        load_video(b"")
    with pytest.raises(MediaError, match="not a supported container"):
        load_video(b"definitely not a video, just some bytes")
    with pytest.raises(MediaError, match="not a supported container"):
        load_video(videos["mp4"][8:])  # header mangled
    data = videos["mp4"]
    with pytest.raises(MediaError, match="video could not be decoded|has no (video stream|frames)"):
        load_video(data[: len(data) // 3])  # truncated: the index (moov) is at the end
    garbage = bytearray(videos["mkv"])
    garbage[40:] = bytes(len(garbage) - 40)
    with pytest.raises(MediaError, match="video could not be decoded|has no (video stream|frames)"):
        load_video(bytes(garbage))
    for muxer, codec in [("matroska", "ffv1"), ("mp4", "mpeg4")]:
        empty = encode_video([], muxer, codec)  # a header, no frames
        assert len(empty) > 100
        with pytest.raises(MediaError, match="video could not be decoded|has no (video stream|frames)"):
            load_video(empty)


def test_videos_sharing_their_first_frames_share_those_hashes():
    rng = np.random.default_rng(0)
    shared = [rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8) for _ in range(5)]
    tail_a = [rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8) for _ in range(3)]
    tail_b = [rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8) for _ in range(3)]
    processing = ImageProcessing.from_hf_config({"size": {"shortest_edge": 16}, "crop_size": 16})
    for muxer, codec in [("mp4", "mpeg4"), ("matroska", "ffv1")]:
        first = prepare_video(encode_video(shared + tail_a, muxer, codec), processing, num_frames=8)
        second = prepare_video(encode_video(shared + tail_b, muxer, codec), processing, num_frames=8)
        assert len(first) == len(second) == 8
        assert [p.content_hash for p in first[:5]] == [p.content_hash for p in second[:5]]
        assert all(a.content_hash != b.content_hash for a, b in zip(first[5:], second[5:]))
        assert first[0].pixel_values.shape == (3, 16, 16)


def test_decoding_stops_at_the_last_sampled_frame():
    # Frames 9..11 are garbage packets: decoding them fails, so only a reader that stops early succeeds.
    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=RATE)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        for index, pixels in enumerate(gray_frames(12)):
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                if index >= 9:
                    garbage = av.Packet(b"\xff" * 7)
                    garbage.pts, garbage.dts, garbage.time_base = packet.pts, packet.dts, packet.time_base
                    garbage.stream = packet.stream
                    packet = garbage
                container.mux(packet)
    data = buf.getvalue()
    assert levels(load_video(data, fps=2.5)) == [0, 4, 8]
    with pytest.raises(MediaError, match="video could not be decoded"):
        load_video(data, num_frames=12)
