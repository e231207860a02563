"""Import the attention kernels for the benchmark scripts: vlserve.kernels if installed, else this tree's kernels/."""

import importlib
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_kernels():
    """The kernels package; without an installed vlserve, kernels/ loaded under a private name."""
    try:
        return importlib.import_module("vlserve.kernels")
    except ImportError:
        spec = importlib.util.spec_from_file_location(
            "vlserve_kernels_tree", ROOT / "kernels" / "__init__.py",
            submodule_search_locations=[str(ROOT / "kernels")])
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module


def kernel_module(package, name: str):
    """A submodule (decode_attention, extend_attention, launch, paged_batch) of the loaded package."""
    return importlib.import_module(f"{package.__name__}.{name}")
