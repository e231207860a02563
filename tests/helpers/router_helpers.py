"""Shared by tests/test_router_*.py: the router on a background thread, request groups, process checks."""

import os

from helpers.lang_helpers import AppServer
from helpers.server_helpers import data_uri, png


def app_thread(app) -> AppServer:
    """An ASGI app with its lifespan (the router's health checks) on a background thread."""
    return AppServer(app, lifespan="on")


QUESTIONS = ["What color is it?", "How many shapes are there?", "Is there a circle?", "Describe the background.",
             "Where is the largest shape?", "Is it daytime?"]


def group_requests(groups: int = 4, per_group: int = 6, max_tokens: int = 4) -> list[tuple[int, dict]]:
    """(group, chat body): each group one image and a shared question prefix, then its own question."""
    out = []
    for g in range(groups):
        uri = data_uri(png(48, 48, seed=100 + g))
        for i in range(per_group):
            text = "Look closely at this picture and answer in one short sentence. " + QUESTIONS[i % len(QUESTIONS)]
            content = [{"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": text}]
            out.append((g, {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                            "temperature": 0}))
    return out


def child_pids(pid: int) -> set[int]:
    """Every descendant of pid still alive (from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if fields[0] != "Z":
                    parents[int(entry)] = int(fields[1])
            except (OSError, IndexError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found
