"""Writing a benchmark's Markdown report, and the provenance line every report opens with."""

import datetime
import os
import platform
import shlex
import subprocess
import sys

import torch


def write_report(path: str, text: str) -> None:
    """Writes text to path (creating its folder) and prints it."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    print(text)


def machine() -> str:
    """The CPU, its cores, torch and Python, and the load at start (the machines are shared)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, Python {platform.python_version()}; "
            f"load average {load:.1f} at start (shared machine)")


def command(argv: list[str] | None = None) -> str:
    """The command line that ran this benchmark (argv: its arguments, default sys.argv[1:])."""
    args = sys.argv[1:] if argv is None else argv
    return "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0]), *args])


def commit() -> str:
    """The checkout's short commit ("unknown" outside a git checkout)."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def provenance(argv: list[str] | None = None) -> str:
    """One Markdown line: the command, the commit, the date and the machine."""
    date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return f"Command: `{command(argv)}` at {commit()}, {date}; machine: {machine()}"
