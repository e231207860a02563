"""The checkout's top-level kernels/ folder must not stand in for an installed `kernels` distribution
(transformers >= 5.25 imports Hugging Face's while loading model modules): vlserve/shadowed_packages.py."""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, extra_path: str) -> subprocess.CompletedProcess:
    # the repository root first on the path, as under `python -m vlserve` or `python -m pytest` from it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, extra_path])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_an_installed_kernels_distribution_wins_over_the_checkouts_folder(tmp_path):
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("CUDAProperties = 'the installed package'\n")
    info = site / "kernels-0.19.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.19.1\n")
    (info / "RECORD").write_text("kernels/__init__.py,,\n")
    done = _run("""
        import vlserve, kernels
        from kernels import CUDAProperties
        print(CUDAProperties)
        from vlserve.kernels import cpu_attention  # ours, under its own name
    """, str(site))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "the installed package"


def test_without_the_distribution_nothing_is_loaded(tmp_path):
    done = _run("""
        import importlib.metadata, sys
        try:
            importlib.metadata.distribution("kernels")
            print("installed")
        except importlib.metadata.PackageNotFoundError:
            import vlserve
            print("kernels" in sys.modules)
    """, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("False", "installed")
