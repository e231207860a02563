"""Loading a script from benchmarks/ in a test, by its path."""

import importlib.util
import os
import sys
from types import ModuleType

BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")


def load_benchmark_script(name: str) -> ModuleType:
    """benchmarks/<name>.py as module vlserve_benchmarks_<name>. Not through sys.path: benchmarks/ is a
    folder of scripts, and on the path its kernels.py would stand in for the `kernels` package in
    every later test."""
    spec = importlib.util.spec_from_file_location(f"vlserve_benchmarks_{name}", os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module
