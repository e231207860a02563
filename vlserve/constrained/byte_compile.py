"""Source (a regex or a JSON schema) → byte DFA: the expensive, tokenizer-free half of a compile.

It is what a compile worker process runs (compile_worker.py), so it needs no tokenizer and returns
plain data. The state limit is checked here; the time limit is the worker's (compile_workers.py).
"""

from __future__ import annotations

from vlserve.constrained.fsm import ByteDFA, build_byte_dfa
from vlserve.constrained.schema import schema_to_regex
from vlserve.core.errors import ConstraintError


class ConstraintTooLarge(ConstraintError):
    """A constraint over the compile budget (too many automaton states, or too long to compile)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason  # "states" or "timeout": the metrics' outcome label


def field_name(kind: str) -> str:
    """How a request names the constraint (the chat API's response_format arrives as json_schema)."""
    return "regex" if kind == "regex" else "json_schema (or response_format)"


def compile_to_byte_dfa(kind: str, text: str, max_states: int) -> tuple[str, ByteDFA]:
    """(the regex, its byte DFA). Raises ConstraintError naming the problem, ConstraintTooLarge over
    `max_states` live states."""
    regex = text if kind == "regex" else schema_to_regex(text)
    dfa = build_byte_dfa(regex)
    if dfa.num_states > max_states:
        raise ConstraintTooLarge(
            f"{field_name(kind)} is too large or too open to compile: its automaton has {dfa.num_states} "
            f"states, over the limit of {max_states} (--grammar-max-states)", "states")
    return regex, dfa
