"""Compile a regex or JSON schema into a byte DFA whose token masks are walked per state.

One ConstraintCompiler per model tokenizer. The expensive half (source → regex → byte DFA) does not
need the tokenizer: with a CompileWorkers pool it runs in a worker process under a time limit, and
without one (tests, benchmarks) on the calling thread. Either way compile_async returns at once with
a Future; compile() waits on it. The budget's state limit is checked on every DFA. Concurrent
requests for the same source share one Future (one compile); results and the request's errors
(ConstraintError, the budget's included) are kept in an LRU keyed by (kind, text). The open JSON
schema and json_object's schema come precompiled (json_automata.py) and stay cached for the
compiler's life.
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from vlserve.core.errors import ConstraintError
from vlserve.constrained.byte_compile import ConstraintTooLarge, compile_to_byte_dfa
from vlserve.constrained.compile_workers import CompileJob, CompileWorkers
from vlserve.constrained.fsm import ByteDFA
from vlserve.constrained.json_automata import precompiled
from vlserve.constrained.token_walk import TokenColumns, allowed_token_ids, dense_table
from vlserve.constrained.vocab import eos_token_ids, token_bytes_table


@dataclass(frozen=True)
class CompileBudget:
    """What one constraint may cost to compile: live byte-DFA states, and wall time in a worker
    process (the time limit needs a CompileWorkers pool: an in-thread compile cannot be stopped).
    The precompiled JSON automata cost no compile and are served whatever the budget. Defaults: the
    open schema `{}` has ~3,100 states and takes outlines-core ~30 s on a loaded 2-core machine;
    ordinary schemas have a few hundred states and compile in well under a second."""

    max_states: int = 20_000
    timeout_s: float = 10.0


class TokenVocab:
    """What every compiled constraint of one tokenizer shares: token bytes, EOS ids, the tokens laid
    out for walking (token_walk.py), and a sorted byte table to find tokens that extend a token."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.size = len(tokenizer)
        self.token_bytes = token_bytes_table(tokenizer)
        self.eos_ids = eos_token_ids(tokenizer)
        self.columns = TokenColumns.of(self.token_bytes, set(self.eos_ids))
        order = sorted((data, tid) for tid, data in enumerate(self.token_bytes) if data is not None)
        self._sorted_bytes = [data for data, _ in order]
        self._sorted_ids = torch.tensor([tid for _, tid in order], dtype=torch.long)

    def extensions(self, data: bytes) -> torch.Tensor:
        """Ids of tokens whose bytes start with `data` and are longer."""
        lo = bisect.bisect_right(self._sorted_bytes, data)
        hi = bisect.bisect_left(self._sorted_bytes, _successor(data), lo) if _successor(data) else len(
            self._sorted_bytes
        )
        return self._sorted_ids[lo:hi]


def _successor(data: bytes) -> bytes | None:
    """The smallest byte string greater than every string that starts with `data`."""
    stripped = data.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class CompiledConstraint:
    """Immutable automaton for one constraint, shared by every request that uses it. The token
    automaton is the byte DFA read a token's bytes at a time, so token and byte states are the same
    ids; `byte_dfa` holds live states only and knows where the regex may end. The allowed-token
    mask of a state is walked on its first visit and cached (a bool row per DFA state)."""

    def __init__(self, vocab: TokenVocab, regex: str, byte_dfa: ByteDFA):
        self.vocab = vocab
        self.regex = regex
        self.byte_dfa = byte_dfa
        self.initial_state: int = byte_dfa.initial
        self._table = dense_table(byte_dfa)
        self._masks: dict[int, torch.Tensor] = {}

    def is_accepting(self, state: int) -> bool:
        return state in self.byte_dfa.accepting

    def next_state(self, state: int, token_id: int) -> int | None:
        """The state after `token_id`, or None if the token is not allowed (EOS included)."""
        if token_id in self.vocab.eos_ids or not 0 <= token_id < self.vocab.size:
            return None
        data = self.vocab.token_bytes[token_id]
        return self.byte_dfa.step(state, data) if data else None

    def mask(self, state: int) -> torch.Tensor:
        """Bool [len(tokenizer)]: the tokens allowed in `state`, EOS only when accepting."""
        row = self._masks.get(state)
        if row is None:
            allowed = np.zeros(self.vocab.size, dtype=np.bool_)
            allowed[allowed_token_ids(self._table, self.byte_dfa.num_states, self.vocab.columns, state)] = True
            allowed[self.vocab.eos_ids] = self.is_accepting(state)
            row = torch.from_numpy(allowed)
            self._masks[state] = row  # a race only computes the same row twice
        return row

    def only_eos_left(self, state: int) -> bool:
        return self.is_accepting(state) and int(self.mask(state).sum()) == len(self.vocab.eos_ids)


CompileObserver = Callable[[float, str], None]  # (seconds, outcome: "ok", "invalid", "states", "timeout", …)


class ConstraintCompiler:
    def __init__(self, tokenizer, cache_size: int = 256, budget: CompileBudget = CompileBudget(),
                 workers: CompileWorkers | None = None, observe: CompileObserver | None = None,
                 cache_states: int = 200_000):
        """cache_size: sources kept; cache_states: their DFA states kept in all (a state costs about
        1 KB of table plus its edges), so many large constraints cannot fill the memory."""
        self._tokenizer = tokenizer
        self._vocab: TokenVocab | None = None
        self._vocab_lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._pinned: dict[tuple[str, str], Future] = {}  # precompiled ones: never evicted
        self._cache_lock = threading.Lock()
        self._cache_size = cache_size
        self._cache_states = cache_states
        self.budget = budget
        self._workers = workers
        self._observe = observe or (lambda seconds, outcome: None)

    def compile(self, regex: str | None = None, json_schema: str | dict | None = None) -> CompiledConstraint:
        """Blocking compile (cached). Raises ConstraintError naming the problem."""
        return self.compile_async(regex, json_schema).result()

    def compile_async(self, regex: str | None = None, json_schema: str | dict | None = None) -> Future:
        """A Future of the CompiledConstraint (already done when cached or compiled in-thread). Raises
        ConstraintError at once for a malformed argument; compile errors arrive through the Future."""
        key = _cache_key(regex, json_schema)
        with self._cache_lock:
            future = self._pinned.get(key) or self._cache.get(key)
            if future is not None:
                if key in self._cache:
                    self._cache.move_to_end(key)
                return future  # compiled, or being compiled for another request
            future = Future()
            self._cache[key] = future
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        future.set_running_or_notify_cancel()
        self._start(future, key)
        return future

    def _start(self, future: Future, key: tuple[str, str]) -> None:
        started = time.monotonic()
        try:
            found = precompiled(key[1]) if key[0] == "json_schema" else None
            if found is not None:
                with self._cache_lock:
                    self._pinned[key] = future
                    self._cache.pop(key, None)
            elif self._workers is not None:
                job = self._workers.submit(CompileJob(key[0], key[1], self.budget.max_states))
                job.add_done_callback(lambda done: self._finish_job(future, started, done))
                return
            else:
                found = compile_to_byte_dfa(*key, self.budget.max_states)
        except BaseException as e:  # delivered to every waiter, including ConstraintError
            self._fail(future, started, e)
            return
        self._finish(future, started, found)

    def _finish_job(self, future: Future, started: float, done: Future) -> None:
        try:
            found = done.result()
        except BaseException as e:
            self._fail(future, started, e)
        else:
            self._finish(future, started, found)

    def _finish(self, future: Future, started: float, found: tuple[str, ByteDFA]) -> None:
        try:
            compiled = self._compiled(*found)
        except BaseException as e:
            self._fail(future, started, e)
            return
        self._observe(time.monotonic() - started, "ok")
        future.set_result(compiled)
        self._trim_cache()

    def _trim_cache(self) -> None:
        """Evicts the least recently used compiled constraints past cache_states states in all."""
        with self._cache_lock:
            sizes = {key: f.result().byte_dfa.num_states for key, f in self._cache.items()
                     if f.done() and f.exception() is None}
            total = sum(sizes.values())
            for key in [k for k in self._cache if k in sizes]:  # oldest first
                if total <= self._cache_states:
                    break
                total -= sizes[key]
                del self._cache[key]

    def _fail(self, future: Future, started: float, error: BaseException) -> None:
        outcome = (error.reason if isinstance(error, ConstraintTooLarge)
                   else "invalid" if isinstance(error, ConstraintError) else "error")
        if outcome == "error":  # the server's fault, maybe passing (a worker that did not start): not cached
            with self._cache_lock:
                for key in [k for k, f in self._cache.items() if f is future]:
                    del self._cache[key]
        self._observe(time.monotonic() - started, outcome)
        future.set_exception(error)

    def _compiled(self, regex: str, byte_dfa: ByteDFA) -> CompiledConstraint:
        compiled = CompiledConstraint(self.token_vocab(), regex, byte_dfa)
        # the first mask is walked here, off the loop; an empty one means a vocabulary without the bytes
        if not compiled.mask(compiled.initial_state).numpy().any():
            raise ConstraintError("the tokenizer cannot produce any string the constraint allows")
        return compiled

    def token_vocab(self) -> TokenVocab:
        """The tokenizer's tables, built on first use (a start-up may call it to pay that early)."""
        with self._vocab_lock:
            if self._vocab is None:
                self._vocab = TokenVocab(self._tokenizer)
            return self._vocab


def _cache_key(regex, json_schema) -> tuple[str, str]:
    if (regex is None) == (json_schema is None):
        raise ConstraintError("give exactly one of regex and json_schema")
    if regex is not None:
        if not isinstance(regex, str):
            raise ConstraintError(f"regex must be a string, got {type(regex).__name__}")
        return ("regex", regex)
    if isinstance(json_schema, dict):
        return ("json_schema", json.dumps(json_schema))  # property order is output order
    if not isinstance(json_schema, str):
        raise ConstraintError(f"json_schema must be a string or an object, got {type(json_schema).__name__}")
    return ("json_schema", json_schema)
