"""ruff (configured in pyproject.toml: pycodestyle errors and warnings, pyflakes, 120 columns) finds
nothing in the repository's Python."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is missing: `scripts/run.sh setup` installs it (the dev extra)"
    run = subprocess.run([ruff, "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
