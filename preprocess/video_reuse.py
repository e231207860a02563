"""A video's sampled frames, processed, reusing every frame an earlier clip decoded from the same
compressed packets (preprocess/video_packets.py, preprocess/frame_cache.py).

Only the frames missing from the cache are decoded, each from its chain's keyframe; a processing
that takes frames one at a time (`process_frame`) finds them processed already, pixel key included,
and one that takes them together (Qwen-VL's `process_sampled`) finds them decoded. A stream whose
packets are not one frame each in order is decoded from its start, as preprocess/video.py does.
The result is the same as prepare.prepare_video's, frame for frame.
"""

import io

import av

from .frame_cache import FrameCache
from .processed import ProcessedImage
from .video import SampledVideo, VideoPlan, decode_errors, decode_from_start, frame_to_rgb
from .video_packets import FrameMismatch, PacketIndex, decode_packets, index_packets


def prepare_planned_video(plan: VideoPlan, processing, cache: FrameCache | None = None) -> list[ProcessedImage]:
    """The plan's frames processed; with no cache, decoded from the stream's start."""
    if cache is None:
        return _process(processing, SampledVideo(decode_from_start(plan), plan.info))
    indices = list(plan.info.frame_indices)
    with decode_errors(plan.container_format), av.open(io.BytesIO(plan.data), format=plan.container_format) as c:
        stream = c.streams.video[0]
        packets = index_packets(c, stream)
        if packets.in_order and len(packets) == plan.info.total_frames:
            try:
                return _from_packets(plan, processing, cache, packets, stream.codec_context, indices)
            except FrameMismatch:
                pass
    return _process(processing, SampledVideo(decode_from_start(plan), plan.info))


def _from_packets(plan: VideoPlan, processing, cache: FrameCache, packets: PacketIndex, context,
                  indices: list[int]) -> list[ProcessedImage]:
    keys, last = [packets.chain_keys[i] for i in indices], len(indices) - 1
    if not hasattr(processing, "process_frame"):
        frames = _decoded(cache, packets, context, sorted(set(indices)))
        return processing.process_sampled(SampledVideo([frames[i] for i in indices], plan.info))
    roles = [processing.frame_role(j == last) for j in range(len(indices))]
    out = [cache.processed(processing, key, role) for key, role in zip(keys, roles)]
    missing = [j for j, image in enumerate(out) if image is None]
    cache.count_reused(len(indices) - len(missing))
    decoded = decode_packets(packets, context, [indices[j] for j in missing], frame_to_rgb)
    for j in missing:
        out[j] = processing.process_frame(decoded[indices[j]], j == last)
        cache.put_processed(processing, keys[j], roles[j], out[j])
    return out


def _decoded(cache: FrameCache, packets: PacketIndex, context, wanted: list[int]) -> dict:
    """{i: RGB frame i}: from the cache, or decoded from the packets and kept."""
    frames = {i: cache.decoded(packets.chain_keys[i]) for i in wanted}
    cache.count_reused(sum(f is not None for f in frames.values()))
    fresh = decode_packets(packets, context, [i for i, f in frames.items() if f is None], frame_to_rgb)
    for i, frame in fresh.items():
        cache.put_decoded(packets.chain_keys[i], frame)
    return {**frames, **fresh}


def _process(processing, video: SampledVideo) -> list[ProcessedImage]:
    if hasattr(processing, "process_sampled"):  # it needs where the frames came from (Qwen-VL: fps, timestamps)
        return processing.process_sampled(video)
    return processing.process_frames(video.frames)
