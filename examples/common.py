"""What the examples share: a backend from the command line, and the built-in model's scenes."""

import argparse
import io
import random

import vlserve.lang as sgl
from vlserve.builtin import scenes


def backend_from_args(description: str):
    """--url URL: a running vlserve server; otherwise an in-process Engine on the built-in model."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", help="a vlserve server, e.g. http://127.0.0.1:30000 (default: in-process)")
    args = parser.parse_args()
    return sgl.RuntimeEndpoint(args.url) if args.url else sgl.Engine()


def scene(seed: int) -> tuple[bytes, list]:
    """A picture the built-in model knows (PNG bytes) and its questions with answers."""
    drawn = scenes.image_scene(random.Random(seed))
    buf = io.BytesIO()
    drawn.frames[0].save(buf, "PNG")
    return buf.getvalue(), drawn.qas


def video_scene(seed: int, frames: int = 6) -> tuple[bytes, list]:
    from vlserve.bench.workload_defs import frames_mkv

    drawn = scenes.video_scene(random.Random(seed), n_frames=frames)
    return frames_mkv(drawn.frames), drawn.qas
