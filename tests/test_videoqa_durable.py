"""`vlserve videoqa` makes each answer durable as it is written, not when the job ends.

Bug caught: AnswerLog.write without flush (lines sit in Python's buffer until close or 8 KiB, so a
crash loses answered work and can tear a line) or without os.fsync (lines sit in the page cache, lost
on power failure). The kill -9 test alone cannot see either: a rerun answers lost ids again.
"""

import json
import os
import threading
import time

import pytest

from vlserve import Engine
from vlserve.bench import videoqa
from vlserve.bench.client import EngineClient
from vlserve.bench.workload_defs import write_videoqa_set
from vlserve.testing.tiny import make_tiny_model

WAIT_S = 15.0  # only a broken implementation ever waits this long (the per-video work is ~0.1 s)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    c = EngineClient(Engine(make_tiny_model(str(tmp_path_factory.mktemp("durable_model")), seed=5),
                            max_total_tokens=8192))
    yield c
    c.close()


@pytest.fixture(scope="module")
def items(tmp_path_factory):
    return write_videoqa_set(str(tmp_path_factory.mktemp("durable_items")), videos=4, seed=11)


def _complete_lines(path: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path, "rb") as f:  # a separate open: sees only what reached the OS, not Python's buffer
        return f.read().count(b"\n")


class GatedClient:
    """Before answering video k, waits until the file on disk holds every answer of videos < k.

    With --parallel-videos 1 the videos are asked one after another, so a log that writes only at
    the end never lets video 2 start: the gate times out and the test fails.
    """

    def __init__(self, inner: EngineClient, output: str):
        self.inner, self.output, self.returned, self.seen_on_disk = inner, output, 0, []

    def generate(self, jobs):
        deadline = time.monotonic() + WAIT_S
        while _complete_lines(self.output) < self.returned:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.returned} answers returned, {_complete_lines(self.output)} on disk")
            time.sleep(0.01)  # polling: the outcome is decided by the file's content, not by the delay
        self.seen_on_disk.append(_complete_lines(self.output))
        answers = self.inner.generate(jobs)
        self.returned += len(answers)
        return answers


def test_file_grows_answer_by_answer_while_the_job_runs(items, client, tmp_path):
    """Each video's answers are on disk before the next video is asked (flush per line)."""
    out = str(tmp_path / "answers.jsonl")
    gated = GatedClient(client, out)
    summary = videoqa.run(items, out, gated, parallel_videos=1, max_new_tokens=4, progress=False)
    assert not summary.errors, summary.errors
    assert len(gated.seen_on_disk) == 4
    assert gated.seen_on_disk == sorted(gated.seen_on_disk) and gated.seen_on_disk[0] == 0
    assert gated.seen_on_disk[-1] > 0  # it grew while the job ran: not only at close
    assert _complete_lines(out) == summary.questions


def test_every_line_is_fsynced_as_soon_as_it_is_written(items, client, tmp_path, monkeypatch):
    """os.fsync runs on the output file after every line, with that line already in the file."""
    out = str(tmp_path / "answers.jsonl")
    synced_sizes = []
    real_fsync, lock = os.fsync, threading.Lock()

    def spy(fd):
        real_fsync(fd)
        if os.path.realpath(f"/proc/self/fd/{fd}") == os.path.realpath(out):
            with lock:
                synced_sizes.append(os.fstat(fd).st_size)

    monkeypatch.setattr(os, "fsync", spy)
    videoqa.run(items, out, client, parallel_videos=2, max_new_tokens=4, progress=False)
    with open(out, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    ends = [sum(len(x) for x in lines[:i + 1]) for i in range(len(lines))]
    assert synced_sizes == ends, "each line must be fsynced before the next is written"
    assert all(json.loads(x)["id"] for x in lines)
