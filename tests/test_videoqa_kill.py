"""`vlserve videoqa --url` killed with SIGKILL at many random points resumes to each answer exactly once.

Bugs caught: a resume that skips nothing (ids written twice) or too much (ids lost), a repair that
leaves a torn line, and a log that does not flush each line (then the file does not grow while the
job runs, and waiting for it to reach the kill point times out).
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from vlserve.bench.videoqa import read_items
from vlserve.bench.workload_defs import write_videoqa_set

pytestmark = pytest.mark.slow

MIN_KILLS = 8
MAX_RUNS = 60  # per pass
MAX_PASSES = 4
LEFT_FOR_LAST = 3  # answers the last (unkilled) run must still give: it resumes, not just re-reads
WAIT_S = 30.0  # for the file to grow by one answer; only a log that does not flush waits this long


@pytest.fixture(scope="module")
def items(tmp_path_factory):
    return write_videoqa_set(str(tmp_path_factory.mktemp("kill_items")), videos=20, seed=3, frames=4)


def _read(path: str) -> tuple[list[dict], bytes]:
    """(parsed complete lines, torn tail)."""
    if not os.path.exists(path):
        return [], b""
    data = open(path, "rb").read()
    end = data.rfind(b"\n") + 1
    return [json.loads(line) for line in data[:end].splitlines()], data[end:]


def _start(items: str, out: str, url: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "vlserve.cli", "videoqa", "--input", items, "--output", out, "--url", url,
           "--parallel-videos", "1", "--max-new-tokens", "6", "--no-progress"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _kill_after(proc: subprocess.Popen, out: str, lines_before: int, rng: random.Random) -> bool:
    """SIGKILL once the file holds 0-2 more answers than before, plus a random few ms; True if it was
    still running (a kill mid-job), False if it finished first."""
    target = lines_before + rng.randint(0, 2)
    deadline = time.monotonic() + WAIT_S
    while len(_read(out)[0]) < target and proc.poll() is None:
        assert time.monotonic() < deadline, f"no progress past {len(_read(out)[0])} answers in {WAIT_S}s"
        time.sleep(0.005)  # polling the file: the kill point is random, every point must be safe
    time.sleep(rng.uniform(0, 0.05))
    running = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return running


def _check_prefix(lines: list[dict], ids: set[str]) -> None:
    got = [r["id"] for r in lines]
    assert len(got) == len(set(got)), "an answer written twice"
    assert set(got) <= ids


def test_random_kill_9_points_then_resume(server, items, tmp_path):
    """Kills at random points until only a few answers remain; after each, the complete lines are
    distinct ids and what earlier runs wrote is kept byte for byte; the last run resumes to every id
    exactly once with no torn line. A fast machine can answer several videos between two kills, so
    whole passes (each on a fresh output file) repeat until at least MIN_KILLS kills landed mid-job."""
    _, srv = server
    ids = {q.qid for _, qs in read_items(items) for q in qs}
    seed = int.from_bytes(os.urandom(4), "little")  # new kill points every run; named on failure
    rng = random.Random(seed)
    mid_job = 0
    for n in range(MAX_PASSES):
        mid_job += _kill_then_resume(items, str(tmp_path / f"answers{n}.jsonl"), srv.url, ids, rng, seed)
        if mid_job >= MIN_KILLS:
            break
    assert mid_job >= MIN_KILLS, f"only {mid_job} kills landed mid-job in {MAX_PASSES} passes (seed {seed})"


def _kill_then_resume(items: str, out: str, url: str, ids: set[str], rng: random.Random, seed: int) -> int:
    """One pass: kills until LEFT_FOR_LAST answers remain, then a run to the end; kills mid-job."""
    mid_job, kept = 0, b""
    for _ in range(MAX_RUNS):
        before, _ = _read(out)
        if len(before) >= len(ids) - LEFT_FOR_LAST:
            break
        mid_job += _kill_after(_start(items, out, url), out, len(before), rng)
        lines, torn = _read(out)
        data = open(out, "rb").read() if os.path.exists(out) else b""
        assert data.startswith(kept), f"a rerun rewrote answers an earlier run had finished (seed {seed})"
        kept = data[: len(data) - len(torn)]
        _check_prefix(lines, ids)
    final = _start(items, out, url)
    _, err = final.communicate(timeout=120)
    assert final.returncode == 0, err.decode()[-2000:]
    lines, torn = _read(out)
    assert torn == b"" and open(out, "rb").read().startswith(kept)
    assert sorted(r["id"] for r in lines) == sorted(ids)
    return mid_job
