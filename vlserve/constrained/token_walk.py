"""Token masks from the byte DFA: every token of the vocabulary walked from one state at once.

A token is allowed in state s when the byte DFA can read all of its bytes from s (the DFA holds
live states only, so a token that would leave every match behind dies on the way). Instead of a
token automaton built up front for every state (outlines-core's Index: as slow again as the byte
DFA itself, and unbounded), the allowed tokens of a state are found when a request first reaches
it: the tokens are sorted by length, longest first, and walked one byte column at a time over a
dense [states + 1, 256] table whose last row is a dead sink — one gather per column, so a 32k
vocabulary costs about a millisecond per state, once per state of a compiled constraint. NumPy,
not torch: the walk runs on compile threads and the loop alike, and torch's parallel kernels
called from a second thread would start a second OpenMP team beside the loop's
(docs/ARCHITECTURE.md, "Threads and processes").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlserve.constrained.fsm import ByteDFA


@dataclass(frozen=True)
class TokenColumns:
    """The vocabulary laid out for walking: ids[:counts[i]] are the tokens longer than i bytes,
    columns[i] their (i+1)-th bytes."""

    ids: np.ndarray  # int64 [n]: token ids with bytes (EOS and special tokens left out), longest first
    columns: tuple[np.ndarray, ...]  # columns[i]: int64 [counts[i]]

    @classmethod
    def of(cls, token_bytes: list[bytes | None], skip: set[int]) -> TokenColumns:
        tokens = sorted(((data, tid) for tid, data in enumerate(token_bytes) if data and tid not in skip),
                        key=lambda item: -len(item[0]))
        longer_than = [0] * (len(tokens[0][0]) if tokens else 0)  # [i]: how many tokens have more than i bytes
        for data, _ in tokens:
            longer_than[len(data) - 1] += 1
        for i in range(len(longer_than) - 2, -1, -1):
            longer_than[i] += longer_than[i + 1]
        columns = [np.array([data[i] for data, _ in tokens[:count]], dtype=np.int64)
                   for i, count in enumerate(longer_than)]
        return cls(np.array([tid for _, tid in tokens], dtype=np.int64), tuple(columns))


def dense_table(dfa: ByteDFA) -> np.ndarray:
    """Flat int32 [(n + 1) * 256]: entry s * 256 + b is the state after byte b in state s; n (the
    row past the last state) is the dead sink, which every missing transition leads to."""
    n = dfa.num_states
    table = np.full((n + 1, 256), n, dtype=np.int32)
    for state, edges in dfa.transitions.items():
        if edges:
            table[state, list(edges)] = list(edges.values())
    return table.reshape(-1)


def allowed_token_ids(table: np.ndarray, sink: int, columns: TokenColumns, state: int) -> np.ndarray:
    """Ids of the tokens whose every byte the DFA reads from `state`."""
    current = np.full(columns.ids.size, state, dtype=np.int64)
    for column in columns.columns:
        k = column.size
        current[:k] = table[current[:k] * 256 + column]
    return columns.ids[current != sink]
