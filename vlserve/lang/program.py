"""@function programs and how they run: one (run), many in parallel (run_batch), streamed."""

import inspect
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

from vlserve.lang.backend import as_backend
from vlserve.lang.executor import StreamExecutor
from vlserve.lang.global_config import global_config
from vlserve.lang.ir import default_sampling_params
from vlserve.lang.state import ProgramState


class SglFunction:
    def __init__(self, func, num_api_spec_tokens: int | None = None, bind_arguments: dict | None = None):
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = bind_arguments or {}
        params = list(inspect.signature(func).parameters)
        if not params:
            raise TypeError(f"an LM program takes the state as its first argument: {func.__name__}()")
        self.arg_names = params[1:]

    def bind(self, **kwargs) -> "SglFunction":
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def run(self, *args, max_new_tokens: int = 128, stop=None, stop_token_ids=None, temperature: float = 1.0,
            top_p: float = 1.0, top_k: int = -1, min_p: float = 0.0, ignore_eos: bool = False,
            stream: bool = False, backend=None, **kwargs) -> ProgramState:
        defaults = default_sampling_params(max_new_tokens=max_new_tokens, stop=stop, stop_token_ids=stop_token_ids,
                                           temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                                           ignore_eos=ignore_eos)
        backend = _backend(backend)
        return run_program(self, backend, args, kwargs, defaults, stream)

    def run_batch(self, batch_kwargs: list[dict], *, max_new_tokens: int = 128, stop=None, stop_token_ids=None,
                  temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1, min_p: float = 0.0,
                  ignore_eos: bool = False, backend=None, num_threads="auto",
                  progress_bar: bool = False) -> list[ProgramState]:
        if not isinstance(batch_kwargs, (list, tuple)) or not all(isinstance(k, dict) for k in batch_kwargs):
            raise TypeError("run_batch takes a list of dicts of arguments")
        defaults = default_sampling_params(max_new_tokens=max_new_tokens, stop=stop, stop_token_ids=stop_token_ids,
                                           temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                                           ignore_eos=ignore_eos)
        backend = _backend(backend)
        if global_config.enable_precache_with_tracing and len(batch_kwargs) > 1:
            precache_prefix(self, backend)
        return run_program_batch(self, backend, batch_kwargs, defaults, num_threads, progress_bar)

    def trace(self, backend=None):
        from vlserve.lang.tracer import trace_prefix

        return trace_prefix(self, _backend(backend))

    def __call__(self, *args, **kwargs):
        """Inside another program: `program(s, ...)` runs this one on the same state."""
        return self.func(*args, **kwargs)


def _backend(backend):
    backend = backend if backend is not None else global_config.default_backend
    if backend is None:
        raise ValueError("no backend: pass backend= or call set_default_backend(...)")
    return as_backend(backend)


def new_state(program: SglFunction, backend, arguments: dict, defaults, stream: bool) -> ProgramState:
    return ProgramState(StreamExecutor(backend, arguments, defaults, None, stream, program.num_api_spec_tokens))


def _run_body(program: SglFunction, state: ProgramState, args, kwargs) -> None:
    """Runs the program's Python code (statements are queued, not awaited), then ends the state."""
    try:
        state.ret_value = program.func(state, *args, **{**kwargs, **program.bind_arguments})
    finally:
        state.stream_executor.end()


def run_program(program: SglFunction, backend, args, kwargs, defaults, stream: bool) -> ProgramState:
    state = new_state(program, backend, kwargs, defaults, stream)
    if stream:
        def body():
            try:
                _run_body(program, state, args, kwargs)
            except BaseException as e:  # noqa: BLE001 - the reader of the stream gets it
                state.stream_executor.set_error(e)
        threading.Thread(target=body, name="sgl-program", daemon=True).start()
        return state
    _run_body(program, state, args, kwargs)
    state.stream_executor.sync()
    return state


def _run_one_captured(program, backend, kwargs, defaults) -> ProgramState:
    """run_batch's unit: an exception in the program is kept in its state (raised again on reading)."""
    state = new_state(program, backend, kwargs, defaults, False)
    try:
        _run_body(program, state, (), kwargs)
    except BaseException as e:  # noqa: BLE001
        state.stream_executor.set_error(e)
    state.stream_executor.sync()
    return state


def run_program_batch(program, backend, batch_kwargs, defaults, num_threads, progress_bar) -> list[ProgramState]:
    if num_threads == "auto":
        num_threads = max(96, multiprocessing.cpu_count() * 16)
    num_threads = max(1, min(int(num_threads), len(batch_kwargs)))
    bar = _progress(len(batch_kwargs)) if progress_bar else None
    with ThreadPoolExecutor(num_threads, thread_name_prefix="sgl-batch") as pool:
        futures = [pool.submit(_run_one_captured, program, backend, kw, defaults) for kw in batch_kwargs]
        if bar is not None:
            for f in futures:
                f.add_done_callback(lambda _: bar.update())
        states = [f.result() for f in futures]
    if bar is not None:
        bar.close()
    return states


def _progress(total: int):
    import tqdm

    return tqdm.tqdm(total=total)


def precache_prefix(program: SglFunction, backend) -> None:
    """run_batch's hint: the program's constant prefix (traced) is prefilled once before the batch."""
    from vlserve.lang.tracer import trace_prefix

    prefix = trace_prefix(program, backend)
    if prefix.text:
        backend.cache_prefix(prefix.text, prefix.media)
