"""What the anyres parity tests share: pictures and videos made here, transformers' greedy reference,
and the comparison of an Engine output with it."""

import io

import av
import numpy as np
import torch
from PIL import Image

FRAMES = 4  # frames sampled per video


def image(size, seed):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8))


def png(img):
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def video(seed: int, n: int = 6) -> bytes:
    rng, buf = np.random.default_rng(seed), io.BytesIO()
    with av.open(buf, "w", format="matroska") as out:
        stream = out.add_stream("ffv1", rate=4)  # lossless
        stream.width, stream.height, stream.pix_fmt = 48, 40, "bgr0"
        for _ in range(n):
            frame = rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


@torch.no_grad()
def hf_greedy(model, kwargs, steps):
    """transformers alone, one request with its KV cache: greedy ids, their logprobs, and the whole
    log-probability row after the prompt."""
    ids, lps, past, rows = [], [], None, []
    for _ in range(steps):
        out = model(**kwargs, past_key_values=past, use_cache=True)
        past = out.past_key_values
        lp = torch.log_softmax(out.logits[0, -1].float(), -1)
        rows.append(lp)
        ids.append(int(lp.argmax()))
        lps.append(float(lp[ids[-1]]))
        kwargs = {"input_ids": torch.tensor([[ids[-1]]])}
    return ids, lps, rows[0]


TOP = 20  # the prefill row is compared on the engine's top-20 log-probabilities


def assert_matches(out, ref):
    """Greedy ids, each step's logprob within 1e-4, and the prefill row's top 20 within 1e-4."""
    ref_ids, ref_lps, prefill_row = ref
    assert out["output_ids"] == ref_ids
    lps = [lp for lp, _ in out["meta_info"]["output_token_logprobs"]]
    assert max(abs(a - b) for a, b in zip(lps, ref_lps)) < 1e-4
    top = out["meta_info"]["output_top_logprobs"][0]
    assert len(top) == TOP and max(abs(lp - float(prefill_row[t])) for lp, t in top) < 1e-4
