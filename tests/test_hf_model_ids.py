"""Models named by Hugging Face id (`--model-path org/name`), served offline from a cache this test
fills in the Hub's own layout (models--org--name/{blobs, snapshots/<commit>, refs/<ref>}), which
huggingface_hub's own cache scanner must accept before anything else runs. HF_HUB_OFFLINE=1
throughout (conftest.py): no test here reaches a network.
"""

import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from huggingface_hub import scan_cache_dir, try_to_load_from_cache
from huggingface_hub.utils import filter_repo_objects

from helpers.server_helpers import wait_healthy
from vlserve.core.config import EngineArgs
from vlserve.core.errors import CheckpointError
from vlserve.model.hub import CHECKPOINT_FILES, resolve_model_path
from vlserve.testing.tiny import make_tiny_model

REPO = "tiny-org/tiny-llava"
MAIN, V2 = "a" * 40, "b" * 40  # the commits refs/main and refs/v2 point at


def put_in_cache(hub: Path, repo_id: str, checkpoint: Path, commit: str, ref: str) -> Path:
    """One revision of a model in the layout huggingface_hub writes: content-addressed blobs (sha256
    for LFS files, the git blob sha1 for the rest), a snapshot of relative symlinks, a ref."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for file in sorted(checkpoint.iterdir()):
        data = file.read_bytes()
        lfs = file.suffix == ".safetensors"
        blob = hashlib.sha256(data).hexdigest() if lfs else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("hf-home")
    for seed, commit, ref in ((0, MAIN, "main"), (1, V2, "v2")):
        checkpoint = Path(make_tiny_model(str(tmp_path_factory.mktemp(f"tiny-{seed}")), seed=seed))
        put_in_cache(home / "hub", REPO, checkpoint, commit, ref)
    return home


@pytest.fixture
def hub_cache(hf_home, monkeypatch) -> Path:
    """This process's huggingface_hub pointed at the filled cache (it read HF_HOME when imported)."""
    from huggingface_hub import constants

    assert constants.HF_HUB_OFFLINE, "the tests run with HF_HUB_OFFLINE=1 (tests/conftest.py)"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    return hf_home / "hub"


def test_huggingface_hub_reads_the_filled_cache_as_its_own(hf_home):
    info = scan_cache_dir(hf_home / "hub")
    assert not info.warnings, info.warnings
    [repo] = info.repos
    assert (repo.repo_id, repo.repo_type) == (REPO, "model")
    refs = {rev.commit_hash: set(rev.refs) for rev in repo.revisions}
    assert refs == {MAIN: {"main"}, V2: {"v2"}}
    for rev in repo.revisions:
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.file_name for f in rev.files}
    found = try_to_load_from_cache(REPO, "config.json", cache_dir=hf_home / "hub", revision="v2")
    assert found == str(hf_home / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / V2 / "config.json")


def test_only_the_files_the_loader_reads_are_fetched():
    """The Hub's own pattern filter over a published LLaVA repository's listing."""
    listing = ["config.json", "generation_config.json", "model-00001-of-00003.safetensors",
               "model-00002-of-00003.safetensors", "model.safetensors.index.json", "pytorch_model-00001-of-00003.bin",
               "pytorch_model.bin.index.json", "tokenizer.json", "tokenizer.model", "tokenizer_config.json",
               "special_tokens_map.json", "added_tokens.json", "preprocessor_config.json", "processor_config.json",
               "chat_template.json", "chat_template.jinja", "README.md", ".gitattributes", "flax_model.msgpack",
               "onnx/model.onnx", "original/consolidated.00.pth"]
    fetched = set(filter_repo_objects(listing, allow_patterns=CHECKPOINT_FILES))
    assert fetched == set(listing) - {"pytorch_model-00001-of-00003.bin", "pytorch_model.bin.index.json", "README.md",
                                      ".gitattributes", "flax_model.msgpack", "onnx/model.onnx",
                                      "original/consolidated.00.pth"}


def test_a_revision_picks_its_snapshot_and_a_missing_one_says_so(hub_cache):
    snapshots = hub_cache / f"models--{REPO.replace('/', '--')}" / "snapshots"
    assert resolve_model_path(REPO) == str(snapshots / MAIN)
    assert resolve_model_path(REPO, revision="v2") == str(snapshots / V2)
    assert resolve_model_path(REPO, revision=V2) == str(snapshots / V2)
    with pytest.raises(CheckpointError, match=r"revision nope\).*not in the Hugging Face cache.*HF_HUB_OFFLINE"):
        resolve_model_path(REPO, revision="nope")


def test_a_local_folder_wins_over_the_id(hub_cache, tmp_path, monkeypatch):
    make_tiny_model(str(tmp_path / REPO))
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path(REPO) == REPO
    assert EngineArgs(model=REPO).model_name() == "tiny-llava"  # a folder is served by its name
    assert EngineArgs(model="/models/llava").model_name() == "llava"  # a path is never an id
    assert EngineArgs(model=REPO + "-absent").model_name() == REPO + "-absent"


def test_engine_serves_a_model_id_from_the_cache(hub_cache):
    from vlserve import Engine

    with Engine(model=REPO, max_total_tokens=1024, num_threads=1) as engine:
        assert engine.loaded.path == str(hub_cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / MAIN)
        out = engine.generate(prompt="USER: hi ASSISTANT:", sampling_params={"max_new_tokens": 3, "ignore_eos": True})
        assert out["meta_info"]["completion_tokens"] == 3
        assert f'model_name="{REPO}"' in engine.metrics.exposition().decode()


def test_engine_refuses_a_missing_id_offline_saying_so(hub_cache):
    from vlserve import Engine

    with pytest.raises(CheckpointError, match="not in the Hugging Face cache .* HF_HUB_OFFLINE is set"):
        Engine(model="tiny-org/absent", max_total_tokens=1024, num_threads=1)


def test_router_reads_its_keys_from_the_ids_revision(hub_cache):
    from vlserve.router.args import RouterArgs
    from vlserve.router.serve import make_keys

    keys = make_keys(RouterArgs(worker_urls=["http://127.0.0.1:9"], model_path=REPO, revision="v2"))
    assert keys.tokenizer.name_or_path == str(hub_cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / V2)


def offline_env(hf_home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return env | {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}


def test_serve_a_model_id_at_a_revision_offline(hf_home, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "vlserve", "serve", "--model-path", REPO, "--revision", "v2", "--port", str(port),
               "--max-total-tokens", "1024", "--num-threads", "1"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=offline_env(hf_home), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url)
        assert [m["id"] for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]] == [REPO]
        info = httpx.get(url + "/get_model_info", timeout=30).json()
        assert info["model_path"] == str(hf_home / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / V2)
        out = httpx.post(url + "/v1/completions", json={"model": REPO, "prompt": "hi", "max_tokens": 2}, timeout=60)
        assert out.status_code == 200 and out.json()["model"] == REPO, out.text
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_serve_a_missing_id_offline_is_one_clear_error(hf_home, tmp_path):
    run = subprocess.run([sys.executable, "-m", "vlserve", "serve", "--model-path", "tiny-org/absent", "--port", "0"],
                         cwd=tmp_path, env=offline_env(hf_home), capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "'tiny-org/absent' (revision main) is not in the Hugging Face cache" in run.stderr
    assert "HF_HUB_OFFLINE is set" in run.stderr and str(hf_home / "hub") in run.stderr
