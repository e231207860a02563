"""benchmarks/workloads.py's timed batches (`--batches`): every batch after the first must compute what
the first did, or the fastest batch, which is the one reported, would be one that found the previous
batch's KV in the radix tree (or its images in the vision-embedding cache) and skipped that work.

Bugs caught: a batch timed against a warm cache (no flush between batches, or one that leaves the
tree or the vision cache full); a report whose wall time is not its fastest batch's, or whose
per-request figures come from another batch than that wall.
"""

import pytest

from vlserve.bench import workload_defs as W
from vlserve.testing.tiny import TinyModelSpec, make_tiny_model

from helpers.bench_script_helpers import load_benchmark_script

harness = load_benchmark_script("workloads")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("batches")), seed=3, spec=TinyModelSpec(image_size=64))


def _vision_images(engine) -> float:
    return engine.metrics.registry.get_sample_value("vlserve_vision_encoder_images_total",
                                                   {"model_name": engine.metrics.model_name}) or 0.0


def test_every_timed_batch_computes_what_the_first_did(model_dir):
    batches = []  # per timed batch: (Σ cached tokens, images through the vision tower, wall of its answers)

    class RecordingClient(harness.EngineClient):
        def generate(self, jobs):
            images = _vision_images(self.engine)
            answers = super().generate(jobs)
            if len(jobs) > 1:  # not the one-request warm-up
                batches.append((sum(a.cached_tokens for a in answers), _vision_images(self.engine) - images,
                                max(a.latency_s for a in answers)))
            return answers

    jobs = W.questions_per_image(images=2, questions=3)
    run, optimum = harness.run_vlserve("vlserve-lpm", model_dir, jobs, threads=1, batches=3,
                                       client_cls=RecordingClient)

    assert len(batches) == 3 and len(run.batch_walls_s) == 3
    cached, encoded, _ = batches[0]
    assert encoded == 2  # the first batch runs both images through the tower
    assert all(b[:2] == (cached, encoded) for b in batches), \
        f"a later batch reused the previous one's cache: (cached tokens, images encoded) per batch {batches}"
    # no batch found more than its own prompts share (the warm-up's KV flushed too)
    assert 0 < cached <= optimum * sum(run.prompt_tokens) + 1e-6
    assert run.wall_s == min(run.batch_walls_s)
    best = run.batch_walls_s.index(run.wall_s)
    assert sum(run.cached_tokens) == batches[best][0]
    assert max(run.latency_s) == pytest.approx(batches[best][2])


def test_one_batch_is_the_single_batch_run(model_dir):
    run, _ = harness.run_vlserve("vlserve-lpm", model_dir, W.few_shot(n=3, examples=2), threads=1)
    assert run.batch_walls_s == [run.wall_s]


def test_batches_below_one_are_refused(capsys):
    with pytest.raises(SystemExit):
        harness.main(["--batches", "0", "--workload", "few_shot"])
    assert "--batches must be at least 1" in capsys.readouterr().err
