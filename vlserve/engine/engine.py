"""The offline and in-server engine: `Engine(model=None, **server_args).generate(...)`.

Threads: the scheduling loop (schedule → forward → sample) runs on one background thread and
touches nothing else. Media decoding, resizing, hashing and tokenization run on the caller's
thread (sync API) or a worker pool (async API); responses are assembled on the caller's side, so
the loop never waits on uploads or streaming (Pillow and PyAV release the GIL for decoding and
resizing; benchmarks/media_stall.py compares decode speed while large vs tiny images arrive).
"""

import asyncio
import logging
import queue
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator

import torch

from vlserve.engine.model_runner import MemoryConfig, ModelRunner, default_max_total_tokens
from vlserve.engine.output import OutputAssembler
from vlserve.engine.prompt import PromptMedia, expand_image_tokens, expand_text, tokenize_text
from vlserve.engine.request import Req, StepOutput
from vlserve.metrics import Metrics
from vlserve.model.attention import default_backend_name
from vlserve.model.builtin import builtin_model_path
from vlserve.model.loader import load_model
from vlserve.preprocess import DEFAULT_NUM_FRAMES, ImageProcessing, MediaLimits, check_image_count, prepare_image, prepare_video
from vlserve.sampling.params import InvalidRequest, SamplingParams
from vlserve.constrained import ConstraintCompiler
from vlserve.scheduler.constraints import ConstraintHooks
from vlserve.scheduler.finish import FinishChecker
from vlserve.scheduler.scheduler import Scheduler, SchedulerConfig
from vlserve.server_args import ServerArgs

log = logging.getLogger(__name__)


class EngineBusy(RuntimeError):
    """The waiting queue is full (HTTP 503 with Retry-After)."""


class Engine:
    def __init__(self, model: str | None = None, **kwargs):
        self.args = args = ServerArgs(model=model, **kwargs)
        if args.num_threads:
            torch.set_num_threads(args.num_threads)
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.loaded = load_model(args.model or builtin_model_path(), dtype=args.dtype, device=device)
        self.tokenizer = self.loaded.tokenizer
        cfg = self.loaded.config
        context = min(args.context_length or cfg.text.max_position_embeddings, cfg.text.max_position_embeddings)
        total = args.max_total_tokens or default_max_total_tokens(self.loaded)
        self.runner = ModelRunner(
            self.loaded, MemoryConfig(total, args.page_size, args.max_running_requests, context),
            args.attention_backend or default_backend_name(), device)
        self.metrics = Metrics()
        self.processing = ImageProcessing.from_hf_config(self.loaded.processor_config)
        self.limits = MediaLimits(max_images_per_request=args.max_images_per_request,
                                  allow_url_fetch=args.allow_url_fetch, allowed_media_path=args.allowed_media_path)
        self.video_frames = args.video_frames or DEFAULT_NUM_FRAMES
        eos = cfg.text.eos_token_ids or ((self.tokenizer.eos_token_id,) if self.tokenizer.eos_token_id is not None else ())
        self.scheduler = Scheduler(
            self.runner,
            SchedulerConfig(args.schedule_policy, args.disable_radix_cache, args.chunked_prefill_size,
                            args.max_running_requests, args.new_token_ratio, args.max_wait_steps,
                            args.prefix_share_threshold, args.vision_cache_mb),
            self.metrics, FinishChecker(self.tokenizer, eos), constraints=self._constraint_hooks())
        self.context_len = self.runner.context_len
        self._inbox: queue.Queue[list[Req]] = queue.Queue()
        self._stop = threading.Event()
        self.media_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="vlserve-media")
        self.loop_heartbeat = time.monotonic()  # written by the loop every iteration; read by /health
        self._thread = threading.Thread(target=self._loop, name="vlserve-engine", daemon=True)
        self._thread.start()

    def _constraint_hooks(self) -> ConstraintHooks:
        self.constraint_compiler = ConstraintCompiler(self.tokenizer)
        return ConstraintHooks(jump_forward=not self.args.disable_jump_forward)

    # ---- the loop (its own thread) -------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self.loop_heartbeat = time.monotonic()
            try:
                self._drain_inbox(block=self.scheduler.idle)
                self.scheduler.step()
            except Exception:  # pragma: no cover - the scheduler already fails the batch's requests
                log.exception("engine step failed")

    def _drain_inbox(self, block: bool) -> None:
        try:
            batch = self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            for req in batch:
                self.scheduler.add(req)
            try:
                batch = self._inbox.get_nowait()
            except queue.Empty:
                return

    # ---- building requests (caller's thread or media pool) -------------------------------------
    def make_request(self, prompt: str | None = None, input_ids: list[int] | None = None,
                     image_data: list | None = None, video_data: list | None = None,
                     sampling_params: dict | SamplingParams | None = None, return_logprob: bool = False,
                     logprob_start_len: int = -1, rid: str | None = None, video_num_frames: int | None = None,
                     video_fps: float | None = None, fit_max_new_tokens: bool = False) -> Req:
        """Validates, decodes media, tokenizes. Raises InvalidRequest / MediaError naming the problem.

        fit_max_new_tokens: lower max_new_tokens to what fits the context and the KV pool (a default
        the client did not ask for) instead of refusing the request."""
        params = sampling_params if isinstance(sampling_params, SamplingParams) else SamplingParams.from_dict(sampling_params)
        if (prompt is None) == (input_ids is None):
            raise InvalidRequest("give exactly one of prompt (text) or input_ids")
        image_data = _as_list(image_data, "image_data")
        video_data = _as_list(video_data, "video_data")
        check_image_count(len(image_data), self.limits)
        images = [prepare_image(src, self.processing, self.limits) for src in image_data]
        frames_kw = ({"fps": video_fps} if video_fps is not None and video_num_frames is None
                     else {"num_frames": video_num_frames or (None if video_fps else self.video_frames), "fps": video_fps})
        videos = [prepare_video(src, self.processing, self.limits, **frames_kw) for src in video_data]
        cfg = self.loaded.config
        if prompt is not None:
            if not isinstance(prompt, str):
                raise InvalidRequest("prompt must be a string")
            text, ordered = expand_text(prompt, PromptMedia(images, videos))
            ids = tokenize_text(self.tokenizer, text)
        else:
            if not (isinstance(input_ids, list) and all(isinstance(t, int) and 0 <= t < cfg.text.vocab_size for t in input_ids)):
                raise InvalidRequest(f"input_ids must be a list of token ids in [0, {cfg.text.vocab_size})")
            ids, ordered = list(input_ids), images + [f for v in videos for f in v]
        ids, spans = expand_image_tokens(ids, cfg.image_token_id, ordered, cfg.tokens_per_image)
        if fit_max_new_tokens:
            params.max_new_tokens = min(params.max_new_tokens, self._room_to_generate(len(ids)))
        self._check_length(len(ids), params)
        req = Req(rid or uuid.uuid4().hex, ids, params, spans, return_logprob, logprob_start_len)
        if params.seed is not None:
            req.generator = torch.Generator().manual_seed(params.seed)
        if params.regex is not None or params.json_schema is not None:
            # compiled here, off the engine loop; cached per constraint. ConstraintError names the problem.
            req.constraint = self.constraint_compiler.compile(params.regex, params.json_schema).new_state()
        return req

    def _room_to_generate(self, prompt_len: int) -> int:
        room = min(self.context_len, self.runner.allocator.capacity) - prompt_len
        if room < 1:
            raise InvalidRequest(f"the prompt has {prompt_len} tokens: no room to generate within the context "
                                 f"length of {self.context_len} tokens and the KV pool of "
                                 f"{self.runner.allocator.capacity}")
        return room

    def is_alive(self, max_stall_s: float = 60.0) -> bool:
        """The loop thread runs and has started an iteration within max_stall_s (a step may be long)."""
        return (self._thread.is_alive() and not self._stop.is_set()
                and time.monotonic() - self.loop_heartbeat < max_stall_s)

    def _check_length(self, prompt_len: int, params: SamplingParams) -> None:
        if prompt_len == 0:
            raise InvalidRequest("the prompt is empty")
        if prompt_len + params.max_new_tokens > self.context_len:
            raise InvalidRequest(f"the prompt has {prompt_len} tokens and max_new_tokens is {params.max_new_tokens}: "
                                 f"together over the context length of {self.context_len} tokens")
        if prompt_len + params.max_new_tokens > self.runner.allocator.capacity:
            raise InvalidRequest(f"the request needs up to {prompt_len + params.max_new_tokens} KV slots, "
                                 f"over the KV pool of {self.runner.allocator.capacity}")

    def submit(self, reqs: list[Req]) -> None:
        """Hands requests to the loop in one batch (so the policy orders them together)."""
        if len(self.scheduler.waiting) + len(reqs) > self.args.max_waiting_requests:
            raise EngineBusy(f"the waiting queue is full ({self.args.max_waiting_requests} requests)")
        self._inbox.put(reqs)

    def abort(self, rid: str) -> None:
        self.scheduler.abort(rid)

    # ---- the public API ------------------------------------------------------------------------
    def generate(self, prompt=None, input_ids=None, image_data=None, video_data=None, sampling_params=None,
                 return_logprob: bool = False, logprob_start_len: int = -1, **kwargs) -> dict | list[dict]:
        """One request, or a batch when prompt / input_ids is a list of them. Blocks until done."""
        batch = _is_batch(prompt, input_ids)
        n = len(prompt if prompt is not None else input_ids) if batch else 1
        reqs, assemblers = [], []
        for i in range(n):
            req = self.make_request(
                _pick(prompt, i, batch), _pick(input_ids, i, batch), _pick_media(image_data, i, batch),
                _pick_media(video_data, i, batch), _pick(sampling_params, i, isinstance(sampling_params, list)),
                return_logprob, logprob_start_len, **kwargs)
            reqs.append(req)
            assemblers.append(self._assembler(req))
        done = [threading.Event() for _ in reqs]
        outputs: list[list[StepOutput]] = [[] for _ in reqs]
        for i, req in enumerate(reqs):
            req.sink = _collecting_sink(outputs[i], done[i])
        self.submit(reqs)
        for event in done:
            event.wait()
        results = [_final_chunk(a, outs) for a, outs in zip(assemblers, outputs)]  # detokenize here, not on the loop
        return results if batch else results[0]

    async def async_generate(self, stream: bool = False, **kwargs) -> dict | AsyncIterator[dict]:
        """One request. stream=False → the final dict; stream=True → an async iterator of chunks.
        If the caller stops iterating (client gone), the request is aborted."""
        loop = asyncio.get_running_loop()
        req = await loop.run_in_executor(self.media_pool, lambda: self.make_request(**kwargs))
        assembler, chunks = self._assembler(req), asyncio.Queue()
        req.sink = lambda out: loop.call_soon_threadsafe(chunks.put_nowait, out)
        self.submit([req])
        if stream:
            return self._stream(req, assembler, chunks)
        try:
            while True:
                chunk = assembler.update(await chunks.get())
                if chunk["finished"]:
                    return chunk
        except asyncio.CancelledError:
            self.abort(req.rid)
            raise

    async def _stream(self, req: Req, assembler: OutputAssembler, chunks: asyncio.Queue) -> AsyncIterator[dict]:
        finished = False
        try:
            while not finished:
                chunk = assembler.update(await chunks.get())
                finished = chunk["finished"]
                yield chunk
        finally:
            if not finished:
                self.abort(req.rid)

    def _assembler(self, req: Req) -> OutputAssembler:
        return OutputAssembler(self.tokenizer, req.sampling.stop, req.sampling.skip_special_tokens, req.return_logprob)

    def pool_state(self) -> dict[str, int]:
        return self.scheduler.cm.pool_state()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        import time
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.scheduler.idle and self._inbox.empty():
                return True
            time.sleep(0.01)
        return False

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.media_pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


def _collecting_sink(outputs: list[StepOutput], done: threading.Event):
    def sink(out: StepOutput) -> None:
        outputs.append(out)
        if out.finished:
            done.set()
    return sink


def _final_chunk(assembler: OutputAssembler, outputs: list[StepOutput]) -> dict:
    for out in outputs[:-1]:
        assembler.update(StepOutput(out.rid, out.new_ids, out.new_logprobs, False, replace_from=out.replace_from))
    chunk = assembler.update(outputs[-1])
    chunk.pop("delta", None)
    chunk.pop("finished", None)
    return chunk


def _is_batch(prompt, input_ids) -> bool:
    if prompt is not None:
        return isinstance(prompt, list)
    return isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)


def _pick(value, i: int, batch: bool):
    return value[i] if batch and value is not None else value


def _pick_media(value, i: int, batch: bool):
    """Media for request i: in a batch, image_data[i] is that request's image or list of images."""
    if value is None or not batch:
        return value
    return value[i]


def _as_list(value, name: str) -> list:
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        return [value]
    if isinstance(value, list):
        return value
    raise InvalidRequest(f"{name} must be a string, bytes or a list of them")
