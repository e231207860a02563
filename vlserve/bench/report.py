"""Writing a benchmark's Markdown report."""

import os


def write_report(path: str, text: str) -> None:
    """Writes text to path (creating its folder) and prints it."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    print(text)
