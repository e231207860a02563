"""Precompiled byte DFAs for the two most common JSON constraints, shipped with the package.

The open schema `{}` (any JSON value) and `{"type": "object"}` (what response_format json_object
becomes) take outlines-core tens of seconds and a few seconds to determinise, yet never change:
their byte DFAs do not depend on the tokenizer. They are built once by

    python -m vlserve.constrained.json_automata

which writes json_automata.json.gz beside this file: for each schema, the regex it was built from
and its states as byte ranges. At run time a schema that parses to one of them is served from the
file (a few ms); the token masks are then walked per tokenizer like any other constraint's. An entry
whose regex no longer equals what schema_to_regex makes now (outlines-core changed) is ignored, so
the shipped automaton can never disagree with the regex path.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
from pathlib import Path

from vlserve.constrained.fsm import ByteDFA, assemble_byte_dfa, build_byte_dfa
from vlserve.constrained.schema import schema_to_regex

log = logging.getLogger(__name__)

DATA_FILE = Path(__file__).with_name("json_automata.json.gz")
PRECOMPILED_SCHEMAS = ({}, {"type": "object"})

_loaded: dict[str, tuple[str, ByteDFA]] | None = None  # canonical schema text → (regex, DFA)
_lock = threading.Lock()


def canonical(schema: dict) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


def precompiled(json_schema_text: str) -> tuple[str, ByteDFA] | None:
    """(regex, byte DFA) for a schema the package ships precompiled, else None."""
    try:
        schema = json.loads(json_schema_text)
    except (json.JSONDecodeError, RecursionError):
        return None
    if schema not in PRECOMPILED_SCHEMAS:
        return None
    return _table().get(canonical(schema))


def _table() -> dict[str, tuple[str, ByteDFA]]:
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load()
        return _loaded


def _load() -> dict[str, tuple[str, ByteDFA]]:
    if not DATA_FILE.exists():
        log.warning("%s is missing: open JSON schemas compile from scratch", DATA_FILE)
        return {}
    entries = json.loads(gzip.decompress(DATA_FILE.read_bytes()))
    table = {}
    for schema in PRECOMPILED_SCHEMAS:
        entry = entries.get(canonical(schema))
        if entry is None or entry["regex"] != schema_to_regex(schema):
            log.warning("the precompiled automaton of %s is stale; rebuild it with "
                        "`python -m vlserve.constrained.json_automata`", canonical(schema))
            continue
        table[canonical(schema)] = (entry["regex"], _from_ranges(entry))
    return table


def _to_ranges(regex: str, dfa: ByteDFA) -> dict:
    states = []
    for state in range(dfa.num_states):
        ranges: list[list[int]] = []  # [first byte, last byte, next state]
        for b, nxt in sorted(dfa.transitions[state].items()):
            if ranges and ranges[-1][1] == b - 1 and ranges[-1][2] == nxt:
                ranges[-1][1] = b
            else:
                ranges.append([b, b, nxt])
        states.append(ranges)
    return {"regex": regex, "initial": dfa.initial, "accepting": sorted(dfa.accepting), "states": states}


def _from_ranges(entry: dict) -> ByteDFA:
    transitions = {state: {b: nxt for lo, hi, nxt in ranges for b in range(lo, hi + 1)}
                   for state, ranges in enumerate(entry["states"])}
    return assemble_byte_dfa(entry["initial"], transitions, frozenset(entry["accepting"]))


def build_data_file(path: Path = DATA_FILE) -> None:
    """Determinises every precompiled schema (about a minute) and writes the data file."""
    entries = {}
    for schema in PRECOMPILED_SCHEMAS:
        regex = schema_to_regex(schema)
        entries[canonical(schema)] = _to_ranges(regex, build_byte_dfa(regex))
    path.write_bytes(gzip.compress(json.dumps(entries, separators=(",", ":")).encode(), mtime=0))


if __name__ == "__main__":
    build_data_file()
    print(f"wrote {DATA_FILE} ({DATA_FILE.stat().st_size} bytes)")
