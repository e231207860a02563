"""Where the built-in model lives: a LLaVA checkpoint shipped inside the package."""

from pathlib import Path

BUILTIN_MODEL_DIR = Path(__file__).resolve().parent.parent / "builtin_model"


def builtin_model_path() -> str:
    if not (BUILTIN_MODEL_DIR / "config.json").exists():
        raise FileNotFoundError(f"the built-in model is missing from {BUILTIN_MODEL_DIR}; pass --model DIR")
    return str(BUILTIN_MODEL_DIR)
