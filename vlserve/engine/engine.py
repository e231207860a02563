"""The offline and in-server engine: `Engine(model=None, **engine_args).generate(...)`.

Threads (docs/ARCHITECTURE.md, "Threads"): the scheduling loop (engine/loop.py) runs on one
background thread and touches nothing else. Media decoding, resizing, hashing and tokenization
(engine/request_builder.py) run on the caller's thread (sync API) or a worker pool (async API);
regexes and JSON schemas compile on worker processes (constrained/compile_workers.py);
responses are assembled on the caller's side, so the loop never waits on uploads or streaming.
"""

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator

import torch

from vlserve.constrained import CompileBudget, CompileWorkers, ConstraintCompiler
from vlserve.core.config import EngineArgs, KernelConfig, MemoryConfig, SchedulerConfig, pick
from vlserve.core.errors import EngineBusy
from vlserve.core.request import Req, StepOutput
from vlserve.cpu.allocator import keep_freed_memory, release_freed_memory
from vlserve.cpu.prefault import activation_bytes, prefault_for_serving
from vlserve.cpu.threads import configure_compute_threads, media_workers
from vlserve.engine.compute_thread import ComputeThread
from vlserve.engine.loop import EngineLoop, step
from vlserve.engine.output import OutputAssembler
from vlserve.engine.request_builder import RequestBuilder
from vlserve.engine.stats_log import StatsLog
from vlserve.memory.pools import KVMemory, KVShape
from vlserve.metrics import Metrics
from vlserve.distributed.launcher import TensorParallelGroup, group_spec, threads_per_rank
from vlserve.distributed.tp_runner import TensorParallelError, TensorParallelRunner
from vlserve.distributed.worker import WorkerConfig
from vlserve.model.attention import default_backend_name
from vlserve.model.tensor_parallel import check_shardable, kv_heads_per_rank
from vlserve.model.builtin import builtin_model_path
from vlserve.model.hub import resolve_model_path
from vlserve.engine.memory_budget import MemoryBudget, usable_bytes, weight_bytes
from vlserve.model.loader import load_model
from vlserve.preprocess import DEFAULT_NUM_FRAMES, FrameCache, MediaLimits, ProcessedImageCache
from vlserve.runner.model_runner import ModelRunner
from vlserve.scheduler.finish import FinishChecker
from vlserve.scheduler.scheduler import Scheduler

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, model: str | None = None, **kwargs):
        self.args = args = EngineArgs(model=model, **kwargs)
        if args.node_rank > 0:
            raise ValueError("node_rank > 0 runs only tensor-parallel worker ranks (`vlserve serve --node-rank N`); "
                             "the engine is node 0's")
        threads = configure_compute_threads(args.num_threads or (
            threads_per_rank(args.tp_size, args.nnodes) if args.tp_size > 1 else None))
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device == "cpu":
            keep_freed_memory()  # before the engine's threads first allocate (cpu/allocator.py)
        # Everything below runs on the thread that will run the model (compute_thread.py): the
        # loading, the pool, and then the loop.
        self._compute = ComputeThread("vlserve-engine")
        try:
            self._compute.run(lambda: self._build(args, threads, device))
        except BaseException:
            self._compute.hand_over(lambda: None)  # ends the thread
            raise

    def _build(self, args: EngineArgs, threads: int, device: str) -> None:
        path = resolve_model_path(args.model, args.revision) if args.model else builtin_model_path()
        usable = usable_bytes(device)  # before the weights take their share
        self.loaded = load_model(path, dtype=args.dtype, device=device, kernels=KernelConfig.from_args(args))
        if device == "cpu":
            release_freed_memory()  # the checkpoint's plain tensors, dropped once packed
        text = self.loaded.config.text
        if args.tp_size > 1:
            check_shardable(text.num_heads, text.num_kv_heads, text.intermediate_size, args.tp_size)
        self.fatal_error: str | None = None  # set when a tensor-parallel rank dies: the engine is stopping
        self.on_fatal = None  # the server's hook: called (from a watchdog thread) with fatal_error
        self._fatal_lock = threading.Lock()
        self.tokenizer = self.loaded.tokenizer
        if args.chat_template:
            self.tokenizer.chat_template = _read_template(args.chat_template)
        self.metrics = Metrics(args.model_name(), args.metrics_names)
        self.memory_budget = MemoryBudget(usable, args.mem_fraction_static, weight_bytes(self.loaded.model),
                                          self._kv_shape().bytes_per_slot)
        self.memory = self._make_memory(device)
        if device == "cpu":  # the first big batch's pages, faulted in now rather than while it runs
            prefault_for_serving(text, self.memory.kv, args.chunked_prefill_size, self.loaded.config.dtype.itemsize)
        self.memory_budget.kv_pool = sum(b.numel() * b.element_size()
                                         for b in self.memory.kv.k_buffers + self.memory.kv.v_buffers)
        self.memory_budget.pool_tokens = self.memory.allocator.capacity
        self.memory_budget.activations = activation_bytes(text, args.chunked_prefill_size,
                                                          self.loaded.config.dtype.itemsize)
        self.memory_budget.log()
        self.context_len = self.memory.context_len
        eos = self._eos_token_ids()
        backend = args.attention_backend or default_backend_name()
        self.tp_group = None
        if args.tp_size > 1:
            self.tp_group = TensorParallelGroup.start(
                group_spec(args.tp_size, args.nnodes, args.dist_init_addr, device), self.loaded,
                WorkerConfig(self.loaded.path, str(self.loaded.config.dtype).replace("torch.", ""),
                             self.memory.kv.num_slots, backend, args.vision_cache_mb, threads,
                             KernelConfig.from_args(args)))
            self.runner = TensorParallelRunner(self.loaded, self.memory, backend, self.metrics, args.vision_cache_mb,
                                               device, eos, dead_rank=self.tp_group.dead_rank,
                                               on_fatal=self._tensor_parallel_failed)
        else:
            self.runner = ModelRunner(self.loaded, self.memory, backend, self.metrics, args.vision_cache_mb, device,
                                      eos)
        self.scheduler = Scheduler(self.memory, pick(SchedulerConfig, args), self.metrics,
                                   FinishChecker(self.tokenizer, eos))
        self.builder = RequestBuilder(
            self.tokenizer, self.loaded.config, self.loaded.image_processing,
            MediaLimits(max_images_per_request=args.max_images_per_request, allow_url_fetch=args.allow_url_fetch,
                        video_max_frames=args.video_max_frames,
                        allowed_media_path=args.allowed_media_path,
                        allowed_media_domains=tuple(h.strip() for h in (args.allowed_media_domains or "").split(",")
                                                    if h.strip())),
            args.video_frames or DEFAULT_NUM_FRAMES, self.context_len, self.memory.allocator.capacity,
            self._constraint_compiler(args),
            ProcessedImageCache(on_process=lambda kind: self.metrics.media_decodes.labels(kind=kind).inc(),
                                frames=FrameCache(on_reuse=self.metrics.media_frames_reused.inc)),
            self.context_note)
        self.media_pool = ThreadPoolExecutor(max_workers=media_workers(threads), thread_name_prefix="vlserve-media")
        self.draining = False  # set by drain(): no new request is accepted
        self.stats_log = StatsLog(self.metrics, self.pool_state,
                                  lambda: (len(self.scheduler.running), len(self.scheduler.waiting)),
                                  args.log_stats_interval)
        self.loop = EngineLoop(self.scheduler, self.runner, after_step=self.stats_log.maybe_log, thread=self._compute)
        if self.tp_group is not None:
            self.tp_group.watch(self._tensor_parallel_failed)
        # The loop's start is this thread's last job: it hands the thread over once _build returns.
        self.loop.start()

    def _constraint_compiler(self, args: EngineArgs) -> ConstraintCompiler:
        """Regexes and JSON schemas compile on worker processes, within the budget; the tokenizer's
        tables are built now, beside the start-up, so the first constrained request does not wait."""
        self.grammar_workers = CompileWorkers(args.grammar_compile_workers, args.grammar_compile_timeout)
        compiler = ConstraintCompiler(self.tokenizer, budget=CompileBudget(args.grammar_max_states,
                                                                           args.grammar_compile_timeout),
                                      workers=self.grammar_workers, observe=self.metrics.observe_grammar_compile)
        threading.Thread(target=compiler.token_vocab, name="vlserve-grammar-vocab", daemon=True).start()
        return compiler

    def _kv_shape(self) -> KVShape:
        cfg, text = self.loaded.config, self.loaded.config.text
        # under tensor parallelism each rank's pool holds its KV heads for every slot
        return KVShape(text.num_layers, kv_heads_per_rank(text.num_kv_heads, self.args.tp_size), text.head_dim,
                       cfg.dtype)

    def _make_memory(self, device: str) -> KVMemory:
        cfg, shape = self.loaded.config, self._kv_shape()
        limit, why = cfg.context_limit
        context = min(self.args.context_length or limit, limit)
        self.context_note = why if why and context == limit else ""  # said at start-up and in 400s
        if self.context_note:
            log.warning("context length %d: %s", context, self.context_note)
        total = self.args.max_total_tokens
        if not total:
            total, note = self.memory_budget.pool_tokens_for_fraction()
            if note:
                log.warning("KV pool: %s", note)
        return KVMemory.create(shape, pick(MemoryConfig, self.args, max_total_tokens=total, context_length=context),
                               device)

    def _eos_token_ids(self) -> tuple[int, ...]:
        return self.loaded.config.text.eos_token_ids or (
            (self.tokenizer.eos_token_id,) if self.tokenizer.eos_token_id is not None else ())

    # ---- requests in --------------------------------------------------------------------------
    def make_request(self, **kwargs) -> Req:
        """Validates, decodes media, tokenizes (RequestBuilder.build). Raises InvalidRequest /
        MediaError / ConstraintError naming the problem."""
        return self.builder.build(**kwargs)

    def submit(self, reqs: list[Req]) -> None:
        """Hands requests to the loop in one batch (so the policy orders them together)."""
        if self.fatal_error:
            raise EngineBusy(f"the engine is stopping: {self.fatal_error}")
        if self.draining:
            raise EngineBusy("the server is shutting down")
        self.loop.submit(reqs, max_queued=self.args.max_waiting_requests)

    def abort(self, rid: str) -> None:
        self.scheduler.abort(rid)

    def step(self) -> None:
        """One scheduling step on the caller's thread: only for an engine whose loop is stopped
        (tests drive the scheduler this way)."""
        step(self.scheduler, self.runner)

    # ---- the public API ------------------------------------------------------------------------
    def generate(self, prompt=None, input_ids=None, image_data=None, video_data=None, sampling_params=None,
                 return_logprob: bool = False, logprob_start_len: int = -1, **kwargs) -> dict | list[dict]:
        """One request, or a batch when prompt / input_ids is a list of them. Blocks until done."""
        batch = _is_batch(prompt, input_ids)
        n = len(prompt if prompt is not None else input_ids) if batch else 1
        pending = [self.builder.build_pending(
            prompt=_pick(prompt, i, batch), input_ids=_pick(input_ids, i, batch),
            image_data=_pick(image_data, i, batch), video_data=_pick(video_data, i, batch),
            sampling_params=_pick(sampling_params, i, isinstance(sampling_params, list)),
            return_logprob=return_logprob, logprob_start_len=logprob_start_len, **kwargs) for i in range(n)]
        reqs = [p.wait() for p in pending]  # a batch's constraints compile side by side
        assemblers = [self._assembler(req) for req in reqs]
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
        pending = await loop.run_in_executor(self.media_pool, lambda: self.builder.build_pending(**kwargs))
        req = await pending.ready()  # a regex / schema compiling elsewhere: no media thread waits on it
        assembler, chunks = self._assembler(req), asyncio.Queue()
        req.sink = lambda out: loop.call_soon_threadsafe(chunks.put_nowait, out)
        self.submit([req])
        if stream:
            return self._stream(req, assembler, chunks)
        try:
            while True:  # not streamed: only the last step is detokenized
                out = await chunks.get()
                if out.finished:
                    return assembler.update(out)
                assembler.absorb(out)
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
        p = req.sampling
        return OutputAssembler(self.tokenizer, p.stop, p.skip_special_tokens, req.return_logprob,
                               stop_regex=p.stop_regex, no_stop_trim=p.no_stop_trim)

    def flush_cache(self, timeout: float = 30.0) -> bool:
        """Empties the radix tree and the vision-embedding cache, on the loop thread, only while no
        request is waiting or running (else False: nothing is flushed)."""
        def flush() -> bool:
            if not self.scheduler.idle:
                return False
            self.scheduler.cm.cache.reset()
            self.runner.embedder.cache.clear()
            return True
        return self.loop.call(flush).result(timeout)

    def tokenize(self, **kwargs) -> list[int]:
        """The prompt's token ids as the radix tree sees them (images as pseudo-token keys)."""
        return self.builder.token_ids(**kwargs)

    # ---- state and life --------------------------------------------------------------------------
    def pool_state(self) -> dict[str, int]:
        return self.scheduler.cm.pool_state()

    def is_alive(self, max_stall_s: float = 60.0) -> bool:
        """The loop thread runs and has started an iteration within max_stall_s (a step may be long)."""
        return self.fatal_error is None and self.loop.is_alive(max_stall_s)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.loop.idle:
                return True
            time.sleep(0.01)
        return False

    def drain(self, grace_s: float) -> bool:
        """Graceful stop: accept nothing new, let what runs finish for up to grace_s, then end the rest
        with an error (HTTP 503). True when everything finished within the grace period."""
        self.draining = True
        finished = self.wait_idle(grace_s)
        if not finished:
            self.loop.call(lambda: self.scheduler.end_all("the server is shutting down", 503)).result(30)
            self.wait_idle(30)
        return finished

    def shutdown(self) -> None:
        self.loop.stop()
        if self.tp_group is not None:
            self.tp_group.broken = self.fatal_error is not None
            self.tp_group.stop(tell_workers=not self.loop.running)
        self.media_pool.shutdown(wait=False, cancel_futures=True)
        self.grammar_workers.shutdown()

    def _tensor_parallel_failed(self, why: str) -> None:
        """A rank died or the group broke (watchdog or loop thread): fail everything queued, refuse new
        requests, and let the server stop (on_fatal)."""
        with self._fatal_lock:  # reported by the watchdog and the loop thread alike: act once
            if self.fatal_error is not None:
                return
            self.fatal_error = why
        log.error("%s; the engine is stopping", why)
        self.runner.failure = self.runner.failure or why
        self.loop.call(lambda: self.scheduler.fail_all(TensorParallelError(why)))
        if self.on_fatal is not None:
            self.on_fatal(why)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


def _read_template(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"--chat-template {path!r} could not be read: {e.strerror}") from None


def _collecting_sink(outputs: list[StepOutput], done: threading.Event):
    def sink(out: StepOutput) -> None:
        outputs.append(out)
        if out.finished:
            done.set()
    return sink


def _final_chunk(assembler: OutputAssembler, outputs: list[StepOutput]) -> dict:
    chunk = assembler.final(outputs)
    chunk.pop("delta", None)
    chunk.pop("finished", None)
    return chunk


def _is_batch(prompt, input_ids) -> bool:
    if prompt is not None:
        return isinstance(prompt, list)
    return isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)


def _pick(value, i: int, batch: bool):
    """Request i's value: in a batch, value[i] (for media, that request's item or list of items)."""
    return value[i] if batch and value is not None else value
