"""No merge-conflict leftovers in tracked text files (one once sat in README.md unnoticed)."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKERS = ("<<<<<<< ", ">>>>>>> ")
TEXT = (".py", ".md", ".sh", ".toml", ".txt", ".json", ".jinja", ".html", ".js", ".css", ".cfg", ".yml", ".yaml")


def test_no_merge_conflict_markers():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        path = ROOT / name
        if not name.endswith(TEXT) or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if line.startswith(MARKERS) or line == "=======":
                found.append(f"{name}:{number}")
    assert not found, "merge-conflict markers: " + ", ".join(found[:20])
