"""The built-in model's training and evaluation (docs/builtin-model.md); its logs are in logs/.
Run from the repository root: `python -m training.builtin.train ...`."""

# First, before transformers: run from the checkout, the top-level kernels/ folder is on sys.path, and
# importing vlserve loads the installed `kernels` distribution under that name (shadowed_packages.py).
import vlserve  # noqa: F401,E402
