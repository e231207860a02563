"""Ranks on several machines, simulated on one: node 0 is an Engine(tp_size=2, nnodes=2) here, node 1
is `vlserve serve --nnodes 2 --node-rank 1` in another process; they meet at --dist-init-addr, answer
as tp_size=1 does, and node 1 exits 0 when node 0's engine shuts down."""

import subprocess
import sys

import pytest

from vlserve import Engine
from vlserve.distributed.group import free_port
from vlserve.testing.tiny import make_tiny_model

pytestmark = pytest.mark.distributed

GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


def test_two_nodes_meet_at_the_init_address_and_match_tp1(tmp_path):
    model = make_tiny_model(str(tmp_path / "m"), seed=2)
    with Engine(model, num_threads=1, max_total_tokens=1024) as engine:
        want = engine.generate(prompt="USER: hello fox ASSISTANT:", sampling_params=GREEDY)["output_ids"]
    addr = f"127.0.0.1:{free_port()}"
    node1 = subprocess.Popen([sys.executable, "-m", "vlserve", "serve", "--model", model, "--tp-size", "2",
                              "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", addr, "--num-threads", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with Engine(model, tp_size=2, nnodes=2, dist_init_addr=addr, num_threads=1, max_total_tokens=1024) as engine:
            assert engine.tp_group.procs == {}  # node 0 runs rank 0 only; rank 1 is node 1's
            got = engine.generate(prompt="USER: hello fox ASSISTANT:", sampling_params=GREEDY)["output_ids"]
        assert got == want
        assert node1.wait(timeout=60) == 0, node1.stdout.read()
    finally:
        node1.kill()
