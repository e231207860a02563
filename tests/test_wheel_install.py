"""The wheel, installed as a user installs it: built the way the Dockerfile builds it (its wheel
stage's files, `pip wheel --no-deps`), checked file by file against the source tree, installed (not
editable) into a fresh virtual environment, then `vlserve serve` run from a folder outside the
checkout on the built-in model answers an upload.

The fresh environment gets vlserve only from the wheel. Its dependencies (torch and the rest, several
GB) are the test environment's, reached through one .pth line appended after the environment's own
site-packages (pip would otherwise copy them all again); `pip check` there confirms the wheel's
declared requirements are met by them. What the installed `vlserve` imports is asserted to lie inside
the fresh environment, and the checkout is never on its sys.path.
"""

import io
import json
import os
import re
import shutil
import site
import socket
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import httpx
import pytest
from PIL import Image, ImageDraw

from helpers.server_helpers import wait_healthy

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
# installed name of each top-level source folder (setup.py's mapping)
INSTALLED_AS = {"vlserve": "vlserve", "kernels": "vlserve/kernels", "preprocess": "vlserve/preprocess"}
DATA_FOLDERS = ("vlserve/builtin_model", "vlserve/server/static", "kernels/csrc")
NOT_SOURCE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")  # as .dockerignore
# in the repository, deliberately not in the wheel: the built-in model's training, evaluation and logs
TRAINING = ROOT / "training" / "builtin"


def dockerfile_wheel_stage() -> tuple[list[str], str]:
    """(the paths the wheel stage copies, its build command) from the Dockerfile."""
    text = DOCKERFILE.read_text()
    stage = re.search(r"^FROM \S+ AS wheel\n(.*?)(?=^FROM )", text, re.M | re.S)
    assert stage, "the Dockerfile has no `FROM ... AS wheel` stage that builds the wheel"
    copied = []
    for line in re.findall(r"^COPY (.+)$", stage.group(1), re.M):
        copied += line.split()[:-1]
    build = re.search(r"^RUN (pip wheel .*)$", stage.group(1), re.M)
    assert build, "the wheel stage does not run `pip wheel`"
    return copied, build.group(1)


def source_files() -> set[str]:
    """Every file the wheel must hold, by its path in the wheel: each .py under vlserve/, kernels/
    and preprocess/, and each file of the data folders."""
    wanted = set()
    for folder, installed in INSTALLED_AS.items():
        for path in (ROOT / folder).rglob("*"):
            rel = path.relative_to(ROOT).as_posix()
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path.suffix == ".py" or any(rel.startswith(d + "/") for d in DATA_FOLDERS):
                wanted.add(installed + rel[len(folder):])
    return wanted


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    copied, build = dockerfile_wheel_stage()
    context = tmp_path_factory.mktemp("docker-context")
    for name in copied:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=NOT_SOURCE)
        else:
            shutil.copy2(source, context / name)
    out = tmp_path_factory.mktemp("wheels")
    assert build.split()[:2] == ["pip", "wheel"] and "--no-deps" in build, build
    # the Dockerfile's command; here without build isolation (setuptools and wheel come with the dev extra)
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                          "--wheel-dir", str(out), "."], cwd=context, capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    # setuptools' warnings (data folders taken for packages, deprecated metadata) fail the build here
    assert "BuildBackendWarning" not in log and "SetuptoolsDeprecationWarning" not in log, log[-5000:]
    [built] = out.glob("vlserve-*.whl")
    return built


def test_the_wheel_holds_every_source_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(source_files() - names)
    assert not missing, f"{len(missing)} files of the source tree are not in the wheel: {missing[:20]}"
    stray = sorted(n for n in names if not n.startswith(("vlserve/", "vlserve-0")))
    assert not stray, f"the wheel installs files outside the vlserve package: {stray[:20]}"
    assert "vlserve/distributed/tp_runner.py" in names and "vlserve/builtin_model/model.safetensors" in names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert re.search(r"^Requires-Dist: huggingface_hub", metadata, re.M | re.I), metadata[:2000]


def test_the_wheel_leaves_out_the_builtin_models_training(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    trainers = sorted(p.name for p in TRAINING.glob("*.py") if p.name != "__init__.py")
    logs = sorted(p.name for p in (TRAINING / "logs").glob("*.csv"))
    assert "train.py" in trainers and "evaluate.py" in trainers and "train_log_stage1.csv" in logs, (trainers, logs)
    shipped = sorted(n for n in names if n.rsplit("/", 1)[-1] in trainers + logs or n.endswith(".csv"))
    assert not shipped, f"training code or logs in the wheel: {shipped}"
    # what serving and `vlserve make-tiny-model` need stays
    for needed in ("vlserve/builtin/scenes.py", "vlserve/builtin/answers.py", "vlserve/cpu/gemm.py",
                   "vlserve/testing/tiny_architectures.py", "vlserve/builtin_model/tokenizer.json"):
        assert needed in names, needed


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed (not editable) and the test environment's
    packages behind its own."""
    env = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    run = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                          "--no-compile", str(wheel)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    fresh_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    assert str(ROOT) not in ours
    (Path(fresh_site) / "zz_test_dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    return env


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return env


def test_installed_vlserve_comes_from_the_wheel(venv, tmp_path):
    probe = ("import json, sys, vlserve, vlserve.distributed.tp_runner, vlserve.kernels, vlserve.preprocess, "
             "vlserve.server.app; print(json.dumps({'files': [vlserve.__file__, vlserve.kernels.__file__, "
             "vlserve.preprocess.__file__, vlserve.distributed.tp_runner.__file__], 'path': sys.path}))")
    run = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path, env=clean_env(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.splitlines()[-1])
    for file in found["files"]:
        assert Path(file).resolve().is_relative_to(venv.resolve()), f"{file} is not the wheel's (in {venv})"
    assert not [p for p in found["path"] if p and Path(p).resolve() == ROOT], found["path"]
    check = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "check"],
                           capture_output=True, text=True, timeout=300)
    # only vlserve's own requirements: the borrowed test packages (SGLang's client, installed without its
    # dependency list) are not the wheel's to satisfy
    unmet = [line for line in check.stdout.splitlines() if line.lower().startswith("vlserve ")]
    assert not unmet and "vlserve" not in check.stderr, \
        "the wheel's requirements are not met: " + check.stdout + check.stderr


def red_circle() -> bytes:
    image = Image.new("RGB", (128, 128), "white")
    ImageDraw.Draw(image).ellipse((34, 34, 94, 94), fill=(230, 30, 30))
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def test_the_installed_command_serves_the_builtin_model_from_elsewhere(venv, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [str(venv / "bin" / "vlserve"), "serve", "--host", "127.0.0.1", "--port", str(port),
               "--max-total-tokens", "4096", "--num-threads", "1"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url)
        assert httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"] == "vlserve-builtin"
        out = httpx.post(url + "/upload", files={"image": ("circle.png", red_circle(), "image/png")},
                         data={"prompt": "What shape is it?", "max_new_tokens": "16", "temperature": "0"},
                         timeout=120)
        assert out.status_code == 200, out.text
        assert out.json()["text"] == "A circle.", out.json()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_installed_command_writes_a_tiny_model(venv, tmp_path):
    command = [str(venv / "bin" / "vlserve"), "make-tiny-model", str(tmp_path / "tiny"), "--arch", "llava"]
    run = subprocess.run(command, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    config = json.loads((tmp_path / "tiny" / "config.json").read_text())
    assert config["architectures"] == ["LlavaForConditionalGeneration"]
