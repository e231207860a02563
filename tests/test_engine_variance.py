"""benchmarks/engine_variance.py: the spread within one engine's batches against the spread between
fresh engines, taken one after another or loaded together with their batches in turn: the figures
RESULTS.md uses to tell a slow engine from a slow spell of the host.

Bugs caught: the two spreads swapped or computed over the wrong axis (a fast engine's slow batch read
as an engine-to-engine difference); a run that times fewer engines or batches than asked, or writes
a report whose spreads are not those of the walls it lists; --together timing one engine only.
"""

import json

import pytest

from vlserve.model.tiny import TinyModelSpec, make_tiny_model

from bench_script_helpers import load_benchmark_script

script = load_benchmark_script("engine_variance")


def _sample(engine: int, walls: list[float]):
    return script.EngineSample(engine, walls, [30.0] * len(walls), [400.0] * len(walls))


def test_spreads_separate_within_from_between():
    # Engine 2 is 20% slower throughout; each engine's batches differ by 1%, 2% and 4%.
    samples = [_sample(1, [1.00, 1.01, 1.005]), _sample(2, [1.20, 1.224, 1.21]), _sample(3, [1.00, 1.04, 1.02])]
    s = script.spreads(samples)
    assert s["within_engine"] == pytest.approx(0.02, abs=1e-4)
    assert s["between_engines"] == pytest.approx(1.21 / 1.005 - 1, abs=1e-4)


def test_one_slow_batch_is_not_a_slow_engine():
    samples = [_sample(1, [1.0, 1.0, 1.5]), _sample(2, [1.0, 1.0, 1.0])]
    s = script.spreads(samples)
    assert s["between_engines"] == pytest.approx(0.0)
    assert s["within_engine"] == pytest.approx(0.25)  # the median of 50% and 0%


@pytest.mark.parametrize("together", [False, True])
def test_run_times_every_engine_and_batch(tmp_path, monkeypatch, together):
    model = make_tiny_model(str(tmp_path / "model"), seed=5, spec=TinyModelSpec(image_size=64))
    monkeypatch.setattr(script, "COPY_MIB", 8)
    monkeypatch.setattr(script, "PROBE_SECONDS", 0.05)
    out = tmp_path / "variance.md"
    assert script.main(["--workload", "tree_of_thought", "--dtype", "float32", "--engines", "2", "--batches", "3",
                        "--model", model, "--out", str(out)] + (["--together"] if together else [])) == 0
    report = json.loads((tmp_path / "variance.json").read_text())
    assert report["order"].startswith("engines loaded together" if together else "one engine after another")
    assert [e["engine"] for e in report["engines"]] == [1, 2]
    for e in report["engines"]:
        assert len(e["batch_walls_s"]) == len(e["copy_gb_s"]) == len(e["gemm_gflops"]) == 3
        assert all(w > 0 for w in e["batch_walls_s"]) and all(b > 0 for b in e["copy_gb_s"])
    samples = [script.EngineSample(**e) for e in report["engines"]]
    assert report["spreads"] == script.spreads(samples)
    assert f"{100 * report['spreads']['between_engines']:.1f}%" in out.read_text()


def test_refuses_a_single_engine(capsys):
    with pytest.raises(SystemExit):
        script.main(["--engines", "1"])
    assert "at least 2" in capsys.readouterr().err
