"""The paper's workloads as batches of requests, deterministic from a seed.

Each workload is a list of bench Jobs (a prompt with `<image>` / `<video>` markers, its media, and
NEW_TOKENS to generate with EOS ignored). The same list goes to vlserve (Engine or HTTP), to
transformers and to vLLM, so the figures compare. Images are synthetic scenes drawn with Pillow;
videos are sampled frames encoded with PyAV when a workload needs a file.
"""

import io
import random
import numpy as np
from PIL import Image, ImageDraw

from vlserve.bench.client import Job

WORDS = ("the a quick brown fox jumps over lazy dog red green blue circle square triangle left right "
         "top bottom small large shape colour picture image video frame moves appears first last "
         "question answer model scene bright dark light shadow water tree house road car bird").split()


NEW_TOKENS = 16  # every workload request generates exactly this many tokens, EOS ignored
VIDEO_FRAMES = 8  # frames sampled from each video: every system is given the same eight


def _request(prompt: str, images: list[bytes] | None = None, videos: list[bytes] | None = None) -> Job:
    return Job(prompt, images or [], videos or [], max_new_tokens=NEW_TOKENS, ignore_eos=True)


def scene_png(seed: int, size: int = 224) -> bytes:
    rng = random.Random(seed)
    img = Image.new("RGB", (size, size), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    for _ in range(rng.randint(1, 3)):
        x, y, r = rng.randrange(size), rng.randrange(size), rng.randint(size // 10, size // 4)
        draw.ellipse((x - r, y - r, x + r, y + r), fill=tuple(rng.randrange(256) for _ in range(3)))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def video_mp4(seed: int, frames: int = 8, size: int = 64) -> bytes:
    import av

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=4)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        base = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
        for i in range(frames):
            frame = np.roll(base, 4 * i, axis=1)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def few_shot(n: int = 24, examples: int = 8, seed: int = 0) -> list[Job]:
    """Shared few-shot examples, distinct questions (the paper's MMLU-style workload)."""
    rng = random.Random(seed)
    shots = "".join(f"Question: {_sentence(rng, 12)}?\nAnswer: {_sentence(rng, 6)}.\n\n" for _ in range(examples))
    header = "USER: Answer like the examples.\n\n" + shots
    return [_request(f"{header}Question: {_sentence(rng, 12)}?\nAnswer: ASSISTANT:") for _ in range(n)]


def questions_per_image(images: int = 4, questions: int = 6, seed: int = 0) -> list[Job]:
    rng = random.Random(seed)
    reqs = []
    for i in range(images):
        png = scene_png(seed * 100 + i)
        reqs += [_request(f"USER: <image>\n{_sentence(rng, 10)}? ASSISTANT:", [png]) for _ in range(questions)]
    return reqs


def tree_of_thought(branches: int = 3, depth: int = 3, seed: int = 0) -> list[Job]:
    """Every node of a thought tree is a request: the problem plus the thoughts on its path."""
    rng = random.Random(seed)
    problem = f"USER: Solve step by step: {_sentence(rng, 30)}.\n"
    reqs, frontier = [], [problem]
    for _ in range(depth):
        nxt = []
        for path in frontier:
            for b in range(branches):
                child = path + f"Thought {b}: {_sentence(rng, 10)}.\n"
                nxt.append(child)
                reqs.append(_request(child + "Next thought: ASSISTANT:"))
        frontier = nxt
    return reqs


def multi_turn_chat(sessions: int = 4, turns: int = 4, seed: int = 0) -> list[Job]:
    """Each turn resends the session's history (with an image in the first turn) plus a new question."""
    rng = random.Random(seed)
    reqs = []
    for s in range(sessions):
        png = scene_png(seed * 100 + 50 + s)
        history = f"USER: <image>\n{_sentence(rng, 10)}? ASSISTANT: {_sentence(rng, 12)}.</s>"
        for _ in range(turns):
            reqs.append(_request(history + f"USER: {_sentence(rng, 10)}? ASSISTANT:", [png]))
            history += f"USER: {_sentence(rng, 10)}? ASSISTANT: {_sentence(rng, 12)}.</s>"
    return reqs


def video_qa(videos: int = 3, questions: int = 4, frames: int = VIDEO_FRAMES, seed: int = 0) -> list[Job]:
    rng = random.Random(seed)
    reqs = []
    for v in range(videos):
        clip = video_mp4(seed * 100 + v, frames)
        reqs += [_request(f"USER: <video>\n{_sentence(rng, 10)}? ASSISTANT:", videos=[clip])
                 for _ in range(questions)]
    return reqs


def zero_reuse(n: int = 24, seed: int = 0) -> list[Job]:
    """ShareGPT-like control: unrelated prompts of varied length, nothing to share."""
    rng = random.Random(seed)
    return [_request(f"{rng.choice(WORDS).upper()}{rng.randrange(10**6)} {_sentence(rng, rng.randint(20, 120))}")
            for _ in range(n)]


WORKLOADS = {
    "few_shot": few_shot,
    "questions_per_image": questions_per_image,
    "tree_of_thought": tree_of_thought,
    "multi_turn_chat": multi_turn_chat,
    "video_qa": video_qa,
    "zero_reuse": zero_reuse,
}


def scaled(name: str, scale: float = 1.0) -> list[Job]:
    """The workload with its number of requests times `scale` (1.0: the workload as defined; each keeps
    its shape: prompts, shared parts and media per request are unchanged)."""
    def n(default: int) -> int:
        return max(1, round(default * scale))

    kwargs = {"few_shot": {"n": n(24)}, "questions_per_image": {"images": n(4)},
              "tree_of_thought": {"depth": 3 if scale >= 0.75 else 2}, "multi_turn_chat": {"sessions": n(4)},
              "video_qa": {"videos": n(3)}, "zero_reuse": {"n": n(24)}}
    return WORKLOADS[name](**kwargs[name])


def union_trie_size(sequences: list[list[int]]) -> int:
    """Distinct prefixes over all sequences: the tokens an ideal cache computes at least once."""
    root: dict = {}
    nodes = 0
    for seq in sequences:
        node = root
        for tok in seq:
            nxt = node.get(tok)
            if nxt is None:
                nxt = node[tok] = {}
                nodes += 1
            node = nxt
    return nodes


def optimal_hit_rate(sequences: list[list[int]]) -> float:
    """(Σ prompt tokens − union trie) / Σ prompt tokens, the paper's optimum for a batch."""
    total = sum(len(s) for s in sequences)
    return (total - union_trie_size(sequences)) / total if total else 0.0


# ---------------------------------------------------------------- synthetic sets with ground truth
# For the built-in model (vlserve.builtin.scenes): answers are known, so the batch jobs report accuracy.


def lossless_mkv(frames, fps: int) -> bytes:
    """RGB uint8 arrays as a Matroska/FFV1 video: lossless, so equal frames decode to equal pixels (a
    clip and its continuation agree on their common frames)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as out:
        stream = out.add_stream("ffv1", rate=fps)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "bgr0"
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def frames_mkv(frames: list[Image.Image], fps: int = 4) -> bytes:
    """Frames as a lossless Matroska/FFV1 video, so decoding gives back the exact pixels drawn."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as out:
        stream = out.add_stream("ffv1", rate=fps)
        stream.width, stream.height = frames[0].size
        stream.pix_fmt = "bgr0"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_image(frame.convert("RGB")).reformat(format="bgr0")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def write_videoqa_set(out_dir: str, videos: int = 6, seed: int = 12345, frames: int = 8) -> str:
    """Scene videos (frames each) under out_dir/videos and out_dir/items.jsonl, one item per video:
    {id, video, questions, answers, qtypes}. Returns the items.jsonl path."""
    import json
    import os

    from vlserve.builtin import scenes

    os.makedirs(os.path.join(out_dir, "videos"), exist_ok=True)
    rng = random.Random(seed)
    path = os.path.join(out_dir, "items.jsonl")
    with open(path, "w") as f:
        for v in range(videos):
            scene = scenes.video_scene(rng, n_frames=frames)
            video = os.path.join(out_dir, "videos", f"v{v:04d}.mkv")
            with open(video, "wb") as vf:
                vf.write(frames_mkv(scene.frames))
            f.write(json.dumps({"id": f"v{v:04d}", "video": video, "questions": [qa.question for qa in scene.qas],
                                "answers": [qa.answer for qa in scene.qas],
                                "qtypes": [qa.qtype for qa in scene.qas]}) + "\n")
    return path


def write_llava_bench_set(out_dir: str, images: int = 8, seed: int = 12345) -> tuple[str, str]:
    """The llava-bench-in-the-wild layout over scene images: out_dir/images/*.png and
    out_dir/questions.jsonl {question_id, image, text, category} with every question a scene
    answers, plus its reference `answer` (category = question type). Returns (questions, images dir)."""
    import json
    import os

    from vlserve.builtin import scenes

    img_dir = os.path.join(out_dir, "images")
    os.makedirs(img_dir, exist_ok=True)
    rng = random.Random(seed)
    path = os.path.join(out_dir, "questions.jsonl")
    qid = 0
    with open(path, "w") as f:
        for i in range(images):
            scene = scenes.image_scene(rng)
            name = f"scene_{i:04d}.png"
            scene.frames[0].save(os.path.join(img_dir, name))
            for qa in scene.qas:
                f.write(json.dumps({"question_id": qid, "image": name, "text": qa.question, "category": qa.qtype,
                                    "answer": qa.answer}) + "\n")
                qid += 1
    return path, img_dir
