"""`vlserve bench ...`: benchmark harnesses.

    vlserve bench llava --questions questions.jsonl --images DIR --answers answers.jsonl [--url URL] [--concurrency N]

The side-by-side workload comparison (vlserve policies, transformers, vLLM) is
`python benchmarks/workloads.py --workload NAME|all`.
"""

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vlserve bench", description="Benchmark harnesses.")
    sub = parser.add_subparsers(dest="harness", required=True)
    from vlserve.bench import llava_bench

    llava = sub.add_parser("llava", help="llava-bench-in-the-wild layout: throughput, TTFT, latency, hit rate")
    llava_bench.add_arguments(llava)
    llava.set_defaults(run=llava_bench.main)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
