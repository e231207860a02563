"""Soak, chaos and overload against a real server (issue 20); see vlserve/bench/soak_driver.py for what runs.

    python benchmarks/soak.py --minutes 60 [--clients 6] [--out benchmarks/results/soak.md]

Serves the tiny test model in this process on 127.0.0.1 with a small KV pool (eviction and
retraction all the time), runs the clients for --minutes with an invariant check every --phase-s
seconds, then an overload ramp on a server with a short queue. Writes a Markdown report and a plot
(RSS and latency over time) beside it.
"""

from __future__ import annotations

import statistics
import sys
import tempfile

from vlserve.bench.harness import bench_parser
from vlserve.bench.report import provenance, write_report
from vlserve.bench.soak_driver import Soak, ramp
from vlserve.testing.tiny import make_tiny_model
from vlserve.server.app import make_engine
from vlserve.server.args import ServerArgs
from vlserve.server.background import BackgroundServer


def serve(model: str, threads: int, **overrides):
    args = ServerArgs(model=model, port=0, max_total_tokens=2560, max_running_requests=32, num_threads=threads,
                      **overrides)
    engine = make_engine(args)
    return engine, BackgroundServer(engine, args).start()


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__.split("\n\n")[0], out="benchmarks/results/soak.md", threads=1)
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--phase-s", type=float, default=30.0)
    p.add_argument("--clients", type=int, default=6)
    args = p.parse_args(argv)
    model = make_tiny_model(tempfile.mkdtemp(prefix="vlserve-soak-"))
    engine, server = serve(model, args.threads)
    try:
        report = Soak(engine, server.url, args.clients).run(args.minutes, args.phase_s)
    finally:
        server.stop()
        engine.shutdown()
    engine, server = serve(model, args.threads, max_waiting_requests=8)
    try:
        steps = ramp(server.url)
    finally:
        server.stop()
        engine.shutdown()
    write_report(args.out, provenance(argv) + "\n\n" + render(args, report, steps))
    plot(report, args.out.rsplit(".", 1)[0] + ".png")
    return 1 if report.failures else 0


def render(args, report, steps) -> str:
    lines = [f"Requests: {sum(report.outcomes.values())}; failed checks: {len(report.failures)}", "",
             "| scenario:outcome | count |", "| --- | ---: |"]
    lines += [f"| {k} | {v} |" for k, v in sorted(report.outcomes.items())]
    lines += ["", "| minute | requests | p50 latency (s) | p99 latency (s) |", "| ---: | ---: | ---: | ---: |"]
    by_minute: dict[int, list[float]] = {}
    for t, _, s in report.latencies:
        by_minute.setdefault(int(t // 60), []).append(s)
    for minute, values in sorted(by_minute.items()):
        values.sort()
        lines.append(f"| {minute} | {len(values)} | {statistics.median(values):.3f} | "
                     f"{values[min(len(values) - 1, int(len(values) * 0.99))]:.3f} |")
    lines += ["", "Invariants after each phase (free + cached == capacity, nothing locked, tree integrity): "
              f"{'held every time' if not report.failures else 'see failures'}", "",
              "| t (s) | requests so far | RSS (MB) | open fds | pool free / cached / in use |",
              "| ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {ph['t']:.0f} | {ph['requests']} | {ph['rss_mb']:.0f} | {ph['fds']} | "
              f"{ph['pool']['free']} / {ph['pool']['cached']} / {ph['pool']['in_use']} |" for ph in report.phases]
    lines += ["", "Overload ramp (--max-waiting-requests 8): every answer is 200 or 503 with Retry-After.", "",
              "| clients | requests | ok/s | 503 share | other statuses |", "| ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {s['clients']} | {s['requests']} | {s['ok_per_s']:.1f} | {s['busy_share']:.1%} "
              f"| {s['other'] or '-'} |" for s in steps]
    if report.failures:
        lines += ["", "Failures:", ""] + [f"- {f}" for f in report.failures[:50]]
    return "\n".join(lines) + "\n"


def plot(report, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install vlserve[bench]); no plot", file=sys.stderr)
        return
    fig, (rss, lat) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    rss.plot([ph["t"] / 60 for ph in report.phases], [ph["rss_mb"] for ph in report.phases], marker="o")
    rss.set_ylabel("RSS (MB)")
    lat.scatter([t / 60 for t, _, _ in report.latencies], [s for _, _, s in report.latencies], s=2)
    lat.set_ylabel("latency (s)")
    lat.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


if __name__ == "__main__":
    sys.exit(main())
