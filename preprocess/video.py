"""Decode a video with PyAV (mp4, webm, mkv, gif) and sample frames uniformly or at a given fps.

The container is chosen from the file's magic bytes and passed to FFmpeg explicitly, so FFmpeg never
probes its way into demuxers that open other files or URLs (HLS, concat).

When the stream reports no frame count (Matroska/WebM, streamed files), frames are counted by a
demux-only pass over the packets (one packet is one frame for these codecs): it reads no pixels, so
it costs a small fraction of a decode, and unlike seeking it needs no cue index. The decode pass then
stops at the last frame it needs.
"""

import io
import math
from contextlib import contextmanager
from dataclasses import dataclass, replace

import av
from PIL import Image

from .errors import MediaError
from .image_loader import to_rgb
from .limits import MediaLimits, check_over
from .media_options import VideoSampling
from .sources import MediaSource, read_source_bytes

DEFAULT_NUM_FRAMES = 8  # when neither num_frames nor fps is given
MAX_SOURCE_FPS = 240  # bounds the frame count a video of the longest allowed duration may have


@dataclass(frozen=True)
class VideoInfo:
    container: str  # FFmpeg demuxer name: "mp4", "matroska" (mkv and webm) or "gif"
    codec: str
    width: int
    height: int
    source_fps: float
    duration_s: float
    total_frames: int
    frames_counted: bool  # True when total_frames came from a demux pass, not the stream header
    frame_indices: tuple[int, ...] = ()  # which frames were sampled, in order (empty while probing)


@dataclass
class SampledVideo:
    frames: list[Image.Image]  # RGB
    info: VideoInfo


def load_video(source: MediaSource, limits: MediaLimits = MediaLimits(),
               num_frames: int | None = None, fps: float | None = None,
               max_frames: int | None = None) -> list[Image.Image]:
    return read_video(source, limits, num_frames, fps, max_frames).frames


def read_video(source: MediaSource, limits: MediaLimits = MediaLimits(),
               num_frames: int | None = None, fps: float | None = None,
               max_frames: int | None = None) -> SampledVideo:
    """max_frames caps either sampling (preprocess/media_options.py, VideoSampling)."""
    plan = plan_video(source, limits, num_frames, fps, max_frames)
    return SampledVideo(decode_from_start(plan), plan.info)


@dataclass(frozen=True)
class VideoPlan:
    """A video probed and sampled, within the limits, before a pixel is decoded."""
    data: bytes
    container_format: str
    info: VideoInfo  # frame_indices set: the frames to decode, in order


def plan_video(source: MediaSource, limits: MediaLimits = MediaLimits(), num_frames: int | None = None,
               fps: float | None = None, max_frames: int | None = None) -> VideoPlan:
    num_frames = check_sampling(num_frames, fps, limits, max_frames)
    data = read_source_bytes(source, limits, "video_max_bytes", "video")
    container_format = sniff_container(data)
    with decode_errors(container_format):
        probe = _probe(data, container_format, limits)
    indices = sample_indices(probe.total_frames, probe.source_fps, num_frames, fps, max_frames)
    if fps is not None:
        check_over(f"sampling fps={fps} from a {probe.duration_s:.3f} s video", len(indices), "frames",
                   limits, "video_max_frames")
    check_decode_budget(probe, max(indices), limits)
    return VideoPlan(data, container_format, replace(probe, frame_indices=tuple(indices)))


def decode_from_start(plan: VideoPlan) -> list[Image.Image]:
    """The sampled frames, decoding the stream from its first frame to the last sampled one."""
    with decode_errors(plan.container_format), av.open(io.BytesIO(plan.data), format=plan.container_format) as c:
        return _decode_frames(c, c.streams.video[0], list(plan.info.frame_indices))


@contextmanager
def decode_errors(container_format: str):
    """FFmpeg's errors as MediaError, naming the container."""
    try:
        yield
    except (av.FFmpegError, OSError, EOFError) as e:
        raise MediaError(f"video could not be decoded ({container_format}): {e}") from None


def check_decode_budget(probe: VideoInfo, last_index: int, limits: MediaLimits) -> None:
    """Every frame up to the last sampled one is decoded: refuse a video whose decode alone would
    hold a media worker for minutes, before decoding a pixel."""
    frames = last_index + 1
    check_over(f"decoding {frames} frames of {probe.width}x{probe.height} to reach the last sampled frame",
               frames * probe.width * probe.height, "pixels", limits, "video_max_decoded_pixels",
               detail="send a shorter or smaller video")


def _probe(data: bytes, container_format: str, limits: MediaLimits) -> VideoInfo:
    """Everything known before decoding a pixel; enforces the frame-size and duration limits."""
    with av.open(io.BytesIO(data), format=container_format) as container:
        stream = _video_stream(container)
        width, height = stream.codec_context.width, stream.codec_context.height
        check_over("video frame", width * height, "pixels", limits, "max_image_pixels", detail=f"size {width}x{height}")
        total, duration, counted = _frame_count_and_duration(container, stream, limits)
        if total == 0:
            raise MediaError("video has no frames")
        check_over("video", round(duration, 3), "seconds", limits, "video_max_duration_s")
        return VideoInfo(container_format, stream.codec_context.name, width, height,
                      _source_fps(stream, total, duration), duration, total, counted)


def check_sampling(num_frames: int | None, fps: float | None, limits: MediaLimits,
                   max_frames: int | None = None) -> int | None:
    """The num_frames to use (None when sampling by fps); MediaError on bad or conflicting arguments."""
    if num_frames is not None and fps is not None:
        raise MediaError(f"give either num_frames or fps, not both (num_frames={num_frames}, fps={fps})")
    if fps is not None:
        if not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
            raise MediaError(f"fps must be a positive number, got {fps!r}")
        return None
    if num_frames is None:
        num_frames = min(DEFAULT_NUM_FRAMES, limits.video_max_frames)
    if not isinstance(num_frames, int) or isinstance(num_frames, bool) or num_frames < 1:
        raise MediaError(f"num_frames must be a positive integer, got {num_frames!r}")
    check_over("request", min(num_frames, max_frames or num_frames), "frames (num_frames)", limits,
               "video_max_frames")
    return num_frames


def sample_indices(total: int, source_fps: float, num_frames: int | None, fps: float | None,
                   max_frames: int | None = None) -> list[int]:
    """Frame indices to keep: `num_frames` spread evenly over [0, total-1] (first and last included;
    all frames if the video has fewer), or one every source_fps/fps frames starting at frame 0
    (thinned to at most max_frames, on the same timestamps)."""
    return VideoSampling(num_frames, fps, max_frames).indices(total, source_fps)


def sniff_container(data: bytes) -> str:
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:4] == b"\x1a\x45\xdf\xa3":  # EBML: Matroska and WebM
        return "matroska"
    if data[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip"):
        return "mp4"
    raise MediaError(f"video is not a supported container (mp4, webm, mkv, gif); first bytes {data[:12]!r}")


def _video_stream(container):
    if not container.streams.video:
        raise MediaError("video file has no video stream")
    return container.streams.video[0]


def _frame_count_and_duration(container, stream, limits: MediaLimits) -> tuple[int, float, bool]:
    time_base = float(stream.time_base) if stream.time_base else 0.0
    if stream.frames > 0:
        if stream.duration and time_base:
            duration = stream.duration * time_base
        elif container.duration:
            duration = container.duration / av.time_base
        else:
            duration = stream.frames / float(stream.average_rate or 1)
        return stream.frames, duration, False
    return (*_count_packets(container, stream, limits, time_base), True)


def _count_packets(container, stream, limits: MediaLimits, time_base: float) -> tuple[int, float]:
    max_frames = math.ceil(limits.video_max_duration_s * MAX_SOURCE_FPS)
    count, start, end = 0, None, 0
    for packet in container.demux(stream):
        if packet.size == 0:  # the flush packet at end of stream
            continue
        count += 1
        pts = packet.pts if packet.pts is not None else packet.dts
        if pts is not None:
            start = pts if start is None else min(start, pts)
            end = max(end, pts + (packet.duration or 0))
            check_over("video", round((end - start) * time_base, 3), "seconds (counted so far)",
                       limits, "video_max_duration_s")
        if count > max_frames:
            raise MediaError(f"video has over {max_frames} frames, more than video_max_duration_s="
                             f"{limits.video_max_duration_s} allows at {MAX_SOURCE_FPS} fps")
    duration = (end - start) * time_base if start is not None else 0.0
    if duration <= 0 and container.duration:
        duration = container.duration / av.time_base
    return count, duration


def _source_fps(stream, total: int, duration: float) -> float:
    if stream.average_rate:
        return float(stream.average_rate)
    if duration > 0:
        return total / duration
    raise MediaError("video reports no frame rate and no duration; cannot sample by time")


def _decode_frames(container, stream, indices: list[int]) -> list[Image.Image]:
    wanted, last_wanted = set(indices), max(indices)
    images: dict[int, Image.Image] = {}
    last_frame, last_index = None, -1
    for index, frame in enumerate(container.decode(stream)):
        if index in wanted:
            images[index] = frame_to_rgb(frame)
        last_frame, last_index = frame, index
        if index >= last_wanted:
            break  # decode no further than the last sampled frame
    if last_frame is None:
        raise MediaError("video has no decodable frames")
    # The packet count can overstate the frames a decoder yields; missing tail indices take the last frame.
    if last_index < last_wanted:
        images.setdefault(last_index, frame_to_rgb(last_frame))
    return [images[min(i, last_index)] for i in indices]


def frame_to_rgb(frame) -> Image.Image:
    if any(component.is_alpha for component in frame.format.components):
        return to_rgb(Image.fromarray(frame.to_ndarray(format="rgba"), "RGBA"))
    return frame.to_image()
