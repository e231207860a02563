"""Exact cache accounting: each request's cached_tokens equals what its token ids say it must be.

Requests run one at a time; after each, the radix tree holds the request's sequence up to its last
computed position (prompt + output minus the last sampled token, in whole pages). The next request
must then be served exactly the longest prefix it shares with any earlier sequence, capped one token
short of its prompt (that token's logits are needed) and cut to whole pages — computed here from the
token ids alone, and compared for equality, not `> 0`.

Bugs caught: admission matching only part of the cached prefix, a request's KV not (or only partly)
inserted at prefill or at finish, an image's pseudo-token keys shared with a different image.
"""

import io
import os

import numpy as np
import pytest
from PIL import Image

from vlserve import Engine
from vlserve.testing.tiny import make_tiny_model

SHARED = "USER: You are a careful assistant. Answer briefly, in one sentence, and be kind. "


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("accounting")), seed=17)


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _workload():
    jobs = [(SHARED + f"Question {i}: what is {i} plus {i}? ASSISTANT:", None) for i in range(3)]
    jobs += [(f"USER: <image>\n{q} ASSISTANT:", _png(1)) for q in ("What colour?", "How many?", "Where?")]
    jobs += [("USER: <image>\nWhat colour? ASSISTANT:", _png(2))]  # same size, other pixels
    jobs += [(SHARED + "Question 0: what is 0 plus 0? ASSISTANT:", None)]  # asked again
    jobs += [("Unrelated words entirely", None)]
    return jobs


@pytest.mark.parametrize("page_size", [1, 4])
def test_every_request_is_served_exactly_its_cached_prefix(model_dir, page_size):
    params = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    in_tree: list[list[int]] = []
    with Engine(model_dir, max_total_tokens=4096, page_size=page_size) as engine:
        for prompt, image in _workload():
            ids = engine.make_request(prompt=prompt, image_data=image).input_ids
            shared = max((len(os.path.commonprefix([ids, seq])) for seq in in_tree), default=0)
            expected = min(shared, len(ids) - 1) // page_size * page_size
            out = engine.generate(prompt=prompt, image_data=image, sampling_params=params)
            assert out["meta_info"]["cached_tokens"] == expected, (prompt, expected)
            seq = ids + out["output_ids"]
            in_tree.append(seq[: (len(seq) - 1) // page_size * page_size])
        assert engine.wait_idle()
        engine.scheduler.cm.check_idle_accounting()
        assert engine.scheduler.cm.cache.total_size() == _union_size(in_tree, page_size)


def _union_size(seqs: list[list[int]], page_size: int) -> int:
    """Slots in the page trie of these sequences: what the radix tree must hold when nothing was
    evicted (two sequences that part inside a page each keep a whole page)."""
    pages: set[tuple[int, ...]] = set()
    for seq in seqs:
        pages.update(tuple(seq[: end]) for end in range(page_size, len(seq) + 1, page_size))
    return len(pages) * page_size
