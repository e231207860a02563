"""What the benchmark entry scripts in benchmarks/ share: their common arguments and the warm-up
request. Reports: report.py (write_report, provenance)."""

import argparse

import torch

from vlserve.bench.client import EngineClient, Job

WARM_UP = Job("USER: warm up the engine ASSISTANT:", max_new_tokens=2, ignore_eos=True)


def bench_parser(doc: str, out: str, threads: int = 2) -> argparse.ArgumentParser:
    """A parser described by the script's docstring, with --out (the report's path or folder) and
    --threads (torch's threads, set by threads_from)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=out, help=f"where the report goes (default: {out})")
    p.add_argument("--threads", type=int, default=threads, help="torch threads")
    return p


def threads_from(args: argparse.Namespace) -> int:
    """Sets torch's threads to --threads; returns it."""
    torch.set_num_threads(args.threads)
    return args.threads


def warm_up(client: EngineClient) -> None:
    """One short request through the engine: first calls build kernels and oneDNN primitives."""
    client.generate([WARM_UP])
