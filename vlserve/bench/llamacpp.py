"""llama.cpp's llama-server as a workloads peer, on the same checkpoint converted to GGUF.

The build and the converters are not the project's: ../shared/peers/llamacpp.sh builds BUILD/bin/llama-server
(and BUILD/src, whose convert_hf_to_gguf.py and gguf-py the converters use); ../shared/peers/llamacpp/ holds
convert_text.py (the text GGUF) and llava_hf_mmproj.py (the CLIP tower and projector). This module calls them
once per checkpoint and weight type and keeps the files beside the checkpoint's other copies.

Each timed batch gets a freshly started server (loading and one short warm-up request untimed), so its per-slot
prompt caches and its host-memory prompt cache (--cache-ram) start empty, as vlserve's and vLLM's caches are
emptied before each batch. The batch's requests go to /completion all at once, with the server's media marker
where each image or video frame sits; the server runs `parallel` of them at a time, in one unified KV buffer of
`ctx_tokens` tokens. Its cached tokens are each answer's timings.cache_n (prompt tokens reused from the slot's
cache); its time to first token is the latency less timings.predicted_ms (the time from its first sampled token
to its last).
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from vlserve.bench.client import Job
from vlserve.bench.peers import PeerRun, best_batch, expand_media

# ../shared/peers beside the repository: llamacpp.sh and the llamacpp/ converters
SHARED_PEERS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                             "shared", "peers"))
CONVERTER_TYPES = ("f32", "f16", "bf16", "q8_0")  # what convert_hf_to_gguf.py writes itself
QUANTIZE_TYPES = {"q4_0": "Q4_0", "q4_k_m": "Q4_K_M"}  # written by llama-quantize from the f16 file
WEIGHT_TYPES = CONVERTER_TYPES + tuple(QUANTIZE_TYPES)
MEDIA_MARKER = "<__vlserve_media__>"  # pinned through LLAMA_MEDIA_MARKER (the server randomises it otherwise)
IMAGE_MARKER = "<image>"


@dataclass
class LlamaCppSetup:
    build_dir: str = "/tmp/llamacpp"  # llamacpp.sh's DIR: bin/llama-server, bin/llama-quantize, src/, pydeps/
    shared_dir: str = SHARED_PEERS  # --llamacpp-dir: llamacpp.sh and llamacpp/{convert_text,llava_hf_mmproj}.py
    weight_type: str = "f16"  # the text GGUF's type (one of WEIGHT_TYPES)
    parallel: int = 4  # --parallel: requests decoded together
    threads: int = 2  # -t and -tb
    ctx_tokens: int = 16384  # -c, one unified KV buffer (-kvu) over every slot
    cache_ram_mib: int | None = None  # --cache-ram; None: the server's default (on)
    poll: int | None = None  # --poll, how hard idle threads spin (0: they sleep); None: the server's default (50)
    timeout_s: float = 1800.0
    # the full-precision checkpoint converted to GGUF (None: the run's own). For a compressed-tensors run
    # it is the checkpoint llm-compressor quantized, so llama.cpp's Q8_0 / Q4 files and vlserve's W8A8 /
    # W4A16 layers start from the same weights (its converter does not read compressed tensors).
    source_model: str | None = None

    def binary(self, name: str) -> str:
        path = os.path.join(self.build_dir, "bin", name)
        if not os.path.exists(path):
            raise FileNotFoundError(f"llama.cpp's {name} is not built at {path}; build it with "
                                    f"bash {os.path.join(self.shared_dir, 'llamacpp.sh')} {self.build_dir}")
        return path

    def script(self, name: str) -> str:
        path = os.path.join(self.shared_dir, "llamacpp", name)
        if not os.path.exists(path):
            raise FileNotFoundError(f"llama.cpp converter {path} is missing (--llamacpp-dir: the folder holding "
                                    "llamacpp.sh and llamacpp/)")
        return path


# ---------------------------------------------------------------- GGUF files


def gguf_files(model_dir: str, setup: LlamaCppSetup, cache_root: str | None = None) -> tuple[str, str]:
    """(text GGUF, mmproj GGUF) for the checkpoint, converted once into CACHE/<name>-gguf/."""
    if setup.weight_type not in WEIGHT_TYPES:
        raise ValueError(f"unknown llama.cpp weight type {setup.weight_type!r}; use one of {', '.join(WEIGHT_TYPES)}")
    root = cache_root or os.path.join(tempfile.gettempdir(), "vlserve-bench-models")
    dest = os.path.join(root, os.path.basename(os.path.normpath(model_dir)) + "-gguf")
    os.makedirs(dest, exist_ok=True)
    mmproj_type = "f32" if setup.weight_type == "f32" else "f16"
    mmproj = os.path.join(dest, f"mmproj-{mmproj_type}.gguf")
    if not os.path.exists(mmproj):
        _convert([sys.executable, setup.script("llava_hf_mmproj.py"), model_dir, mmproj]
                 + (["--f16"] if mmproj_type == "f16" else []), setup, mmproj)
    return _text_gguf(model_dir, setup, dest, setup.weight_type), mmproj


def _text_gguf(model_dir: str, setup: LlamaCppSetup, dest: str, weight_type: str) -> str:
    out = os.path.join(dest, f"text-{weight_type}.gguf")
    if os.path.exists(out):
        return out
    if weight_type in QUANTIZE_TYPES:
        source = _text_gguf(model_dir, setup, dest, "f16")
        _convert([setup.binary("llama-quantize"), source, out, QUANTIZE_TYPES[weight_type]], setup, out)
    else:
        _convert([sys.executable, setup.script("convert_text.py"), os.path.join(setup.build_dir, "src"), model_dir,
                  "--outtype", weight_type, "--outfile", out], setup, out)
    return out


def is_compressed(model_dir: str) -> bool:
    """Whether the checkpoint's config.json has a quantization_config (compressed-tensors)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        return "quantization_config" in json.load(f)


def _convert(cmd: list[str], setup: LlamaCppSetup, out: str) -> None:
    """Runs a converter into out.partial, then renames it (an interrupted run leaves no half file)."""
    partial = out + ".partial"
    cmd = [partial if c == out else c for c in cmd]
    env = {**os.environ, "LLAMA_CPP_SRC": os.path.join(setup.build_dir, "src"),
           "PYTHONPATH": os.pathsep.join(p for p in (os.path.join(setup.build_dir, "pydeps"),
                                                     os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0 or not os.path.exists(partial):
        raise RuntimeError(f"{' '.join(cmd[:3])} failed (exit {done.returncode}):\n{done.stdout[-3000:]}")
    os.replace(partial, out)


# ---------------------------------------------------------------- the server


class LlamaServer:
    """llama-server on 127.0.0.1 at a free port, started on enter and stopped on exit."""

    def __init__(self, setup: LlamaCppSetup, text_gguf: str, mmproj_gguf: str, log_path: str):
        self.setup, self.text, self.mmproj, self.log_path = setup, text_gguf, mmproj_gguf, log_path
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        s = self.setup
        cmd = [s.binary("llama-server"), "-m", self.text, "--mmproj", self.mmproj, "-t", str(s.threads),
               "-tb", str(s.threads), "-c", str(s.ctx_tokens), "--parallel", str(s.parallel), "-kvu",
               "--host", "127.0.0.1", "--port", str(self.port)]
        return (cmd + ([] if s.cache_ram_mib is None else ["--cache-ram", str(s.cache_ram_mib)])
                + ([] if s.poll is None else ["--poll", str(s.poll)]))

    def __enter__(self) -> LlamaServer:
        import httpx

        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                                     env={**os.environ, "LLAMA_MEDIA_MARKER": MEDIA_MARKER})
        log.close()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}) at start:\n{self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise RuntimeError(f"llama-server was not ready in 300 s:\n{self._log_tail()}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _log_tail(self) -> str:
        with open(self.log_path) as f:
            return f.read()[-3000:]


def _die_with_parent() -> None:
    """In the server's process before exec: Linux sends it SIGKILL when the harness dies (a killed harness
    runs no __exit__, and a busy server would keep its two cores spinning)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- requests


@dataclass
class _Prepared:
    prompt: str  # the media marker at each image or frame
    images_b64: list[str]
    max_new_tokens: int


def prepare(req: Job, video_frames: int) -> _Prepared:
    """The request as llama-server's /completion takes it: videos as their frames, each a PNG."""
    text, images = expand_media(req, video_frames)
    encoded = []
    for im in images:
        buf = io.BytesIO()
        im.save(buf, "PNG")
        encoded.append(base64.b64encode(buf.getvalue()).decode())
    return _Prepared(text.replace(IMAGE_MARKER, MEDIA_MARKER), encoded, req.max_new_tokens)


def completion_body(p: _Prepared) -> dict:
    prompt = {"prompt_string": p.prompt, "multimodal_data": p.images_b64} if p.images_b64 else p.prompt
    return {"prompt": prompt, "n_predict": p.max_new_tokens, "ignore_eos": True, "temperature": 0.0,
            "cache_prompt": True, "stream": False}


@dataclass
class _Answer:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    latency_s: float
    ttft_s: float


def _send(http, url: str, body: dict, start: float) -> _Answer:
    resp = http.post(f"{url}/completion", json=body)
    latency = time.monotonic() - start
    if resp.status_code != 200:
        raise RuntimeError(f"llama-server answered {resp.status_code}: {resp.text[:500]}")
    out = resp.json()
    timings = out["timings"]
    return _Answer(out["content"], out["tokens_evaluated"], out["tokens_predicted"], timings["cache_n"], latency,
                   max(0.0, latency - timings["predicted_ms"] / 1000))


def _batch(server: LlamaServer, prepared: list[_Prepared], timeout_s: float) -> tuple[float, list[_Answer]]:
    import httpx

    bodies = [completion_body(p) for p in prepared]
    with httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_connections=len(bodies) + 1)) as http:
        _send(http, server.url, {"prompt": "warm up", "n_predict": 2, "ignore_eos": True, "temperature": 0.0,
                                 "cache_prompt": False}, time.monotonic())
        with ThreadPoolExecutor(len(bodies)) as pool:
            start = time.monotonic()
            futures = [pool.submit(_send, http, server.url, b, start) for b in bodies]
            answers = [f.result() for f in futures]
        return time.monotonic() - start, answers


def run_llamacpp(model_dir: str, reqs: list[Job], video_frames: int = 8, setup: LlamaCppSetup | None = None,
                 batches: int = 1) -> PeerRun:
    """`batches` timed batches, each on a freshly started server; the fastest one's figures. Raises
    FileNotFoundError when llama.cpp is not built (callers skip with a message)."""
    setup = setup or LlamaCppSetup()
    source = setup.source_model or model_dir
    if is_compressed(source):
        raise ValueError(f"{source} is a compressed-tensors checkpoint: llama.cpp converts full-precision weights; "
                         "name the checkpoint it was quantized from (--llamacpp-model)")
    setup.binary("llama-server")
    text_gguf, mmproj = gguf_files(source, setup)
    prepared = [prepare(r, video_frames) for r in reqs]
    log_path = os.path.join(os.path.dirname(text_gguf), "llama-server.log")
    walls, runs = [], []
    for _ in range(batches):
        with LlamaServer(setup, text_gguf, mmproj, log_path) as server:
            wall, answers = _batch(server, prepared, setup.timeout_s)
        walls.append(wall)
        runs.append(answers)
    answers = runs[best_batch(walls)]
    ram = "default" if setup.cache_ram_mib is None else setup.cache_ram_mib
    poll = "default" if setup.poll is None else setup.poll
    note = (f"llama.cpp b11434 llama-server /completion, {setup.weight_type} weights of "
            f"{os.path.basename(os.path.normpath(source))}, --parallel {setup.parallel}, "
            f"-t/-tb {setup.threads}, --poll {poll}, -c {setup.ctx_tokens} -kvu, --cache-ram {ram}; "
            "cached = timings.cache_n")
    return PeerRun(f"llamacpp-{setup.weight_type}-p{setup.parallel}", min(walls), [a.prompt_tokens for a in answers],
                   [a.completion_tokens for a in answers], [a.cached_tokens for a in answers],
                   [a.latency_s for a in answers], [a.ttft_s for a in answers], [a.text for a in answers], note,
                   batch_walls_s=walls)
