"""`vlserve serve` with every forward paced: python tests/helpers/paced_serve.py SECONDS_PER_FORWARD [serve flags].

For tests whose timing needs a request that outlasts a deadline: the tiny random model runs a
2,000-token answer in about 1.5 s on a fast CPU, under a 2 s drain; paced to 5 ms a forward it
takes 10 s there and longer anywhere slower, while a 12-token answer still ends in a fraction of a
second."""

import sys
import time

from vlserve.cli import main
from vlserve.runner.model_runner import ModelRunner

if __name__ == "__main__":
    pace = float(sys.argv[1])
    run = ModelRunner.run

    def paced_run(self, plan):
        time.sleep(pace)
        return run(self, plan)

    ModelRunner.run = paced_run
    sys.exit(main(["serve", *sys.argv[2:]]))
