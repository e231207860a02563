"""Compile a regex or JSON schema into a token automaton plus the compressed byte FSM.

One ConstraintCompiler per model tokenizer. compile() is expensive (tens of ms at a 32k vocab):
the engine calls it while building a request, off the scheduling loop. Concurrent requests for
the same constraint share one Future (the first compiles, the others wait on it); results and
errors are kept in an LRU cache keyed by (kind, text).
"""

from __future__ import annotations

import bisect
import json
import threading
from collections import OrderedDict
from concurrent.futures import Future

import torch
from outlines_core import Index, Vocabulary

from vlserve.core.errors import ConstraintError
from vlserve.constrained.fsm import ByteDFA, build_byte_dfa, with_end_sentinel
from vlserve.constrained.schema import schema_to_regex
from vlserve.constrained.vocab import eos_token_ids, token_bytes_table


class TokenVocab:
    """What every compiled constraint of one tokenizer shares: token bytes, EOS ids, the
    outlines-core Vocabulary, and a sorted byte table to find tokens that extend a token."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.size = len(tokenizer)
        self.token_bytes = token_bytes_table(tokenizer)
        self.eos_ids = eos_token_ids(tokenizer)
        mapping: dict[bytes, list[int]] = {}
        for tid, data in enumerate(self.token_bytes):
            if data is not None and tid not in self.eos_ids:
                mapping.setdefault(data, []).append(tid)
        self.outlines_vocab = Vocabulary(self.eos_ids[0], mapping)
        # the only tokens that can step onto the end sentinel's path (its UTF-8 starts with F4)
        self.sentinel_risk = [tid for tid, data in enumerate(self.token_bytes) if data and 0xF4 in data]
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
    """Immutable automata for one constraint, shared by every request that uses it. Token and
    byte automata come from the same regex (with the end sentinel), so they share state ids;
    `byte_dfa` knows which states are live and where the regex may end. The per-state
    allowed-token masks are built on first visit and cached (a bool row per DFA state)."""

    def __init__(self, vocab: TokenVocab, regex: str, index: Index, byte_dfa: ByteDFA):
        self.vocab = vocab
        self.regex = regex
        self.index = index
        self.byte_dfa = byte_dfa
        self.initial_state: int = index.get_initial_state()
        self._masks: dict[int, torch.Tensor] = {}
        self._eos = torch.tensor(vocab.eos_ids, dtype=torch.long)

    def is_accepting(self, state: int) -> bool:
        return state in self.byte_dfa.accepting

    def next_state(self, state: int, token_id: int) -> int | None:
        """The state after `token_id`, or None if the token is not allowed (EOS included)."""
        if token_id in self.vocab.eos_ids or not 0 <= token_id < self.vocab.size:
            return None
        nxt = self.index.get_next_state(state, token_id)
        return nxt if nxt in self.byte_dfa.transitions else None  # live states only

    def mask(self, state: int) -> torch.Tensor:
        """Bool [len(tokenizer)]: the tokens allowed in `state`, EOS only when accepting."""
        row = self._masks.get(state)
        if row is None:
            row = torch.zeros(self.vocab.size, dtype=torch.bool)
            allowed = [t for t in self.index.get_allowed_tokens(state) or [] if t < self.vocab.size]
            if allowed:
                row[torch.tensor(allowed, dtype=torch.long)] = True
            for tid in self.vocab.sentinel_risk:
                if row[tid] and self.next_state(state, tid) is None:
                    row[tid] = False
            row[self._eos] = self.is_accepting(state)
            self._masks[state] = row  # a race only computes the same row twice
        return row

    def only_eos_left(self, state: int) -> bool:
        return self.is_accepting(state) and int(self.mask(state).sum()) == len(self.vocab.eos_ids)


class ConstraintCompiler:
    def __init__(self, tokenizer, cache_size: int = 256):
        self._tokenizer = tokenizer
        self._vocab: TokenVocab | None = None
        self._vocab_lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._cache_size = cache_size

    def compile(self, regex: str | None = None, json_schema: str | dict | None = None) -> CompiledConstraint:
        """Blocking compile (cached). Raises ConstraintError naming the problem."""
        key = _cache_key(regex, json_schema)
        with self._cache_lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                return future.result()  # compiled, or being compiled by another thread
            future = Future()
            self._cache[key] = future
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        self._run(future, key)
        return future.result()

    def _run(self, future: Future, key: tuple[str, str]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(self._build(*key))
        except BaseException as e:  # delivered to every waiter, including ConstraintError
            future.set_exception(e)

    def _build(self, kind: str, text: str) -> CompiledConstraint:
        regex = text if kind == "regex" else schema_to_regex(text)
        byte_dfa = build_byte_dfa(regex)  # validates and names regex problems first
        vocab = self._token_vocab()
        try:
            index = Index(with_end_sentinel(regex), vocab.outlines_vocab)
        except ValueError as e:
            raise ConstraintError(
                f"the tokenizer cannot produce every string the constraint needs: {e}"
            ) from None
        return CompiledConstraint(vocab, regex, index, byte_dfa)

    def _token_vocab(self) -> TokenVocab:
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
