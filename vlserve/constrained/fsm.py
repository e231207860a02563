"""The character-level compressed FSM (SGLang §4, Appendix B.1), over UTF-8 bytes.

The byte-level DFA comes from the same regex engine as the token automaton: outlines-core's
Index built over a vocabulary of the 256 single bytes, whose token transitions *are* the DFA's
byte transitions. States that cannot reach an accepting state are pruned.

outlines-core's Index drops transitions that leave an accepting state through a non-accepting one
(regex-automata reports matches one byte late, and outlines-core 0.2 reads that delayed match as
"not a full match"): `x(ab)?` would never emit "ab". So every regex is compiled with an end
sentinel, `(?:R)` + U+10FFFF, and no state before the sentinel is accepting. "R may end here" is
"the sentinel can be read from here". States that lead only into the sentinel are dead and
pruned, so real output never takes the sentinel's path (tokens that would are masked out).
Token masks are walked over this DFA (token_walk.py), so token and byte states are the same ids,
renumbered 0..n-1 over the live states.

A state is *singular* when it is not accepting (accepting means EOS is an alternative) and has
exactly one outgoing byte. A chain of singular transitions is merged into one compressed edge:
`forced[s]` is the longest byte string that every accepted continuation from s starts with.
"""

from __future__ import annotations

from dataclasses import dataclass

from outlines_core import Index, Vocabulary

from vlserve.core.errors import ConstraintError

_BYTE_EOS = 256
_BYTE_VOCAB = None
END_SENTINEL = "\U0010FFFF".encode("utf-8")


def with_end_sentinel(regex: str) -> str:
    return f"(?:{regex})\\x{{10FFFF}}"


def _byte_vocabulary() -> Vocabulary:
    global _BYTE_VOCAB
    if _BYTE_VOCAB is None:
        _BYTE_VOCAB = Vocabulary(_BYTE_EOS, {bytes([b]): [b] for b in range(256)})
    return _BYTE_VOCAB


@dataclass
class ByteDFA:
    initial: int
    transitions: dict[int, dict[int, int]]  # live states only: state → {byte: next state}
    accepting: frozenset[int]  # states where the regex may end (the sentinel is readable)
    forced: dict[int, bytes]  # compressed edges: state → forced byte string (non-empty only)

    @property
    def num_states(self) -> int:
        return len(self.transitions)

    def step(self, state: int | None, data: bytes) -> int | None:
        """The state after reading `data`, or None if the DFA rejects it."""
        for b in data:
            if state is None:
                return None
            state = self.transitions.get(state, {}).get(b)
        return state


def _live_states(transitions: dict[int, dict[int, int]], accepting: set[int]) -> set[int]:
    reverse: dict[int, set[int]] = {}
    for src, edges in transitions.items():
        for dst in edges.values():
            reverse.setdefault(dst, set()).add(src)
    live, todo = set(accepting), list(accepting)
    while todo:
        for src in reverse.get(todo.pop(), ()):
            if src not in live:
                live.add(src)
                todo.append(src)
    return live


def _compress(transitions: dict[int, dict[int, int]], accepting: frozenset[int]) -> dict[int, bytes]:
    def singular(s: int) -> bool:
        return s not in accepting and len(transitions.get(s, {})) == 1

    forced: dict[int, bytes] = {}
    for start in transitions:
        if not singular(start) or start in forced:
            continue
        chain, s = [], start
        while singular(s) and s not in forced and len(chain) <= len(transitions):  # no live singular cycle
            (b, nxt), = transitions[s].items()
            chain.append((s, b))
            s = nxt
        tail = forced.get(s, b"")
        for s_i, b in reversed(chain):
            tail = bytes([b]) + tail
            forced[s_i] = tail
    return forced


def build_byte_dfa(regex: str) -> ByteDFA:
    """Raises ConstraintError (named problem) for an invalid or unsatisfiable regex."""
    try:
        index = Index(with_end_sentinel(regex), _byte_vocabulary())
    except ValueError as e:
        raise ConstraintError(_explain(regex, str(e))) from None
    raw = {
        s: {b: nxt for b, nxt in edges.items() if b != _BYTE_EOS}
        for s, edges in index.get_transitions().items()
    }
    final = set(index.get_final_states())
    raw_dfa = ByteDFA(index.get_initial_state(), raw, frozenset(), {})
    accepting = {s for s in raw if raw_dfa.step(s, END_SENTINEL) in final}
    # Liveness is "can reach a state where R may end": the sentinel's own path (and the state
    # after it) is dead, so real output can never walk into it.
    live = _live_states(raw, accepting)
    if raw_dfa.initial not in live:
        raise ConstraintError(f"unsatisfiable regex {regex!r}: no string matches it")
    # outlines-core's state ids are sparse (millions apart): live states are renumbered 0..n-1
    number = {s: i for i, s in enumerate(sorted(live))}
    transitions = {
        number[s]: {b: number[nxt] for b, nxt in edges.items() if nxt in live}
        for s, edges in raw.items() if s in live
    }
    return assemble_byte_dfa(number[raw_dfa.initial], transitions, frozenset(number[s] for s in accepting))


def assemble_byte_dfa(initial: int, transitions: dict[int, dict[int, int]], accepting: frozenset[int]) -> ByteDFA:
    """A ByteDFA over live states numbered 0..n-1, with its compressed edges."""
    return ByteDFA(initial, transitions, accepting, _compress(transitions, accepting))


def _explain(regex: str, message: str) -> str:
    if "incompatible with the regex" in message:
        return f"unsatisfiable regex {regex!r}: no string matches it"
    import re

    try:
        re.compile(regex)
    except re.error as e:
        return f"invalid regex {regex!r}: {e}"
    return f"unsupported regex {regex!r} (lookaround, backreferences and anchors inside are not regular): {message}"
