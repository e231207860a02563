"""Reading the batch jobs' JSONL inputs, with errors that name the file and line."""

import json
from typing import Iterator


def iter_jsonl(path: str) -> Iterator[tuple[str, dict]]:
    """("path:line", object) for every non-blank line. Raises ValueError naming a bad line."""
    with open(path) as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{n}", json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
