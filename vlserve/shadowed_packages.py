"""The repository's top-level `kernels/` folder against the PyPI package `kernels`.

Our kernels install as `vlserve.kernels` (pyproject's package-dir), but wherever the checkout's root
is on sys.path — `python -m vlserve` or `python -m pytest` run from it — a bare `import kernels`
finds the folder first. transformers 5.25 and later depend on Hugging Face's `kernels` package and
import it (transformers.integrations.hub_kernels) while loading any model module, and then fail on
our folder ("cannot import name 'CUDAProperties' from 'kernels'"). Loading the installed
distribution under its own name before transformers looks for it settles which one `kernels` is.
"""

import importlib.metadata
import importlib.util
import os
import sys


def load_installed_kernels_package() -> bool:
    """Puts the installed `kernels` distribution in sys.modules, unless a `kernels` module is loaded
    already or none is installed. True when it loaded it."""
    if "kernels" in sys.modules:
        return False
    try:
        init = importlib.metadata.distribution("kernels").locate_file("kernels/__init__.py")
    except importlib.metadata.PackageNotFoundError:
        return False
    init = os.fspath(init)
    if not os.path.isfile(init):
        return False
    spec = importlib.util.spec_from_file_location("kernels", init, submodule_search_locations=[os.path.dirname(init)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels"] = module
    try:
        spec.loader.exec_module(module)
    except Exception:  # a broken install: leave the name free, as before
        del sys.modules["kernels"]
        return False
    return True
