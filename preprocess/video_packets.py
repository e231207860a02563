"""A video's compressed packets, demuxed without decoding, each named by the chain it decodes from.

A frame's pixels are a function of the packets a decoder is fed to reach it: an intra frame's of its
own packet, any other frame's of the chain from the last keyframe before it (or from the stream's
start). So each packet gets a chain key, xxh3_128 over the stream's decoding parameters (codec,
size, pixel format, extradata) and the bytes of every packet of its chain, folded packet by packet.
Two clips whose packets agree up to a frame (a growing recording re-sent: the same encoder output
for the same frames) give that frame the same key, and a decoder fed the same chain gives the same
pixels: reusing the earlier clip's decoded frame is exact, not a guess.

The same chains say where decoding may start: a frame is decoded from its chain's first packet
(a seek to the keyframe, done on the packets in memory), not from the start of the stream.

This holds where a packet is one frame in presentation order: every packet has a timestamp and they
increase in decode order (no B-frame reordering). `in_order` says so; elsewhere the caller decodes
the stream from its start (preprocess/video.py). The decoder's output is checked against it too:
one frame per packet, each with its packet's timestamp, or `FrameMismatch`.
"""

from dataclasses import dataclass

import xxhash

SESSION_FRESH, SESSION_USED = "fresh", "used"


class FrameMismatch(Exception):
    """The decoder did not give one frame per packet, in order: decode from the start instead."""


@dataclass
class PacketIndex:
    packets: list  # av.Packet, decode order, empty (flush) packets left out
    chain_keys: list[bytes]  # per packet: 16 bytes, the chain it decodes from
    chain_starts: list[int]  # per packet: index of its chain's first packet (a keyframe, or 0)
    in_order: bool  # every packet has a pts, strictly increasing: packet i is frame i

    def __len__(self) -> int:
        return len(self.packets)


def index_packets(container, stream) -> PacketIndex:
    """One demux pass over the stream (no pixel decoded)."""
    context = stream.codec_context
    params = xxhash.xxh3_128()
    for part in (context.name, context.width, context.height, context.pix_fmt or ""):
        params.update(str(part).encode() + b"\0")
    params.update(bytes(context.extradata or b""))
    params_key = params.digest()
    packets, keys, starts, last_pts, in_order = [], [], [], None, True
    for packet in container.demux(stream):
        if packet.size == 0:
            continue
        fresh = not packets or packet.is_keyframe
        chain = xxhash.xxh3_128(params_key if fresh else keys[-1])
        chain.update(memoryview(packet))
        starts.append(len(packets) if fresh else starts[-1])
        keys.append(chain.digest())
        packets.append(packet)
        if packet.pts is None or (last_pts is not None and packet.pts <= last_pts):
            in_order = False
        last_pts = packet.pts
    return PacketIndex(packets, keys, starts, in_order)


def decode_packets(index: PacketIndex, context, wanted: list[int], to_image) -> dict:
    """{i: to_image(frame i)} for the packet indices `wanted`, each decoded from its chain's start or
    from where the decoder already is, whichever feeds fewer packets."""
    out, session = {}, _Session(index, context)
    for i in sorted(set(wanted)):
        if session.fed is None or session.fed < index.chain_starts[i] - 1 or session.fed >= i:
            session.start(index.chain_starts[i])
        session.feed_through(i, set(wanted), out, to_image)
    return out


@dataclass
class _Session:
    """One run of the decoder over consecutive packets, from a chain's start."""
    index: PacketIndex
    context: object  # the stream's av.CodecContext
    fed: int | None = None  # last packet fed; None: not started, or drained
    next_frame: int = 0  # the packet whose frame the decoder gives next
    state: str = SESSION_FRESH

    def start(self, first: int) -> None:
        if self.state == SESSION_USED:
            self.context.flush_buffers()  # the decoder as new: no reference frame, no end of stream
        self.state, self.fed, self.next_frame = SESSION_USED, first - 1, first

    def feed_through(self, last: int, wanted: set[int], out: dict, to_image) -> None:
        while self.fed < last:
            self.fed += 1
            self._take(self.context.decode(self.index.packets[self.fed]), wanted, out, to_image)
        if self.next_frame <= last:  # the decoder holds frames back (frame threads): drain it
            self._take(self.context.decode(None), wanted, out, to_image)
            self.fed = None
        if self.next_frame <= last:
            raise FrameMismatch(f"packet {last} gave no frame")

    def _take(self, frames, wanted: set[int], out: dict, to_image) -> None:
        for frame in frames:
            i = self.next_frame
            if i >= len(self.index.packets) or (frame.pts is not None and frame.pts != self.index.packets[i].pts):
                raise FrameMismatch(f"frame with pts {frame.pts} where packet {i}'s was expected")
            if i in wanted:
                out[i] = to_image(frame)
            self.next_frame += 1
