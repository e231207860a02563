"""Runs transformers' Qwen-VL processors, which need torchvision, in a process of their own.

`scripts/run.sh setup` installs torchvision 0.28 (without compiled ops) into
$VENV/reference-torchvision, off the venv's import path: with torchvision importable, transformers
would build its torchvision image processors for every model, and the LLaVA tests compare with its
PIL ones. Only the reference process gets it on PYTHONPATH. A missing install fails the test,
saying how to make it.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REFERENCE_TORCHVISION = os.environ.get("VLSERVE_REFERENCE_TORCHVISION",
                                       str(Path(sys.prefix) / "reference-torchvision"))
HELPERS = Path(__file__).resolve().parent


def reference_torchvision_dir() -> str:
    if not (Path(REFERENCE_TORCHVISION) / "torchvision" / "__init__.py").exists():
        pytest.fail(f"torchvision for transformers' Qwen-VL processors is missing from {REFERENCE_TORCHVISION}: "
                    "run `scripts/run.sh setup` (or set VLSERVE_REFERENCE_TORCHVISION to such a folder)")
    return REFERENCE_TORCHVISION


def run_reference(script: str, *args: str, timeout: float = 600) -> str:
    """Runs tests/helpers/SCRIPT with the reference torchvision importable; its stdout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [reference_torchvision_dir(),
                                                                      os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(HELPERS / script), *args], capture_output=True, text=True,
                         env=env, timeout=timeout)
    assert out.returncode == 0, f"{script} failed:\n{out.stderr[-4000:]}"
    return out.stdout
