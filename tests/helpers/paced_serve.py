"""`vlserve serve` with every forward paced: python tests/helpers/paced_serve.py SECONDS_PER_FORWARD [serve flags].

For tests whose timing needs a request that outlasts a deadline: the tiny random model runs a
2,000-token answer in about 1.5 s on a fast CPU, under a 2 s drain; paced to 5 ms a forward it
takes 10 s there and longer anywhere slower, while a 12-token answer still ends in a fraction of a
second. The pace is the engine loop's step gate (EngineLoop.step_gate), called before each forward."""

import functools
import sys
import time

from vlserve.cli import parse_serve_args
from vlserve.server.app import make_engine, run_server


def paced_engine(args, pace: float):
    engine = make_engine(args)
    engine.loop.step_gate = functools.partial(time.sleep, pace)
    return engine


if __name__ == "__main__":
    pace = float(sys.argv[1])
    sys.exit(run_server(parse_serve_args(sys.argv[2:]), functools.partial(paced_engine, pace=pace)) or 0)
