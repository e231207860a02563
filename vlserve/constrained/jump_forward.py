"""Jump-forward with retokenisation.

When a request stands at the start of a compressed edge (a forced string), append the forced text
at once instead of decoding it token by token. The text is appended as *text*: the last few output
tokens plus the forced bytes are re-encoded with the model's tokenizer, because token boundaries
move at the junction (`{"na` + `me": "` encodes as `{"`, `name`, `":`, ` "`).

Rules (the pitfalls of sglang issue 2045):
- The retokenised window starts at most RETOKENIZE_WINDOW tokens back, at a UTF-8 character
  boundary; earlier tokens are the model's own and stay. The re-encoded ids must spell exactly the
  same bytes (no added prefix space, no special tokens), else no jump.
- The jump is cut back to a *stable* token boundary: the last kept token must (a) end inside the
  forced text, (b) end on a UTF-8 character boundary, and (c) be maximal — no longer vocabulary
  token that extends it is allowed by the constraint where it starts. (c) is what keeps the model
  in charge of the boundary: if ` "` could still grow into ` ""` or ` "\\`, we stop before ` "` and
  let the model choose, instead of forcing a split no tokenizer would make.
- Jumps of fewer than MIN_JUMP_CHARS characters are not worth an extend pass.

propose_jump only proposes: it reads the state and returns the whole new output, or None. The
caller (the scheduler, which knows whether the tail's KV is already shared in the radix tree)
applies it once: Req.output_ids = new_output_ids and state.replace_tail(keep_len, the new tail),
which walks the new ids so the state points exactly at the end of the retokenised output.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlserve.constrained.state import ConstraintState

RETOKENIZE_WINDOW = 8
MIN_JUMP_CHARS = 2


@dataclass(frozen=True)
class JumpForward:
    new_output_ids: list[int]  # the whole retokenised output
    keep_len: int  # leading ids unchanged from the old output: their KV stays
    jumped_text: str  # text appended by the jump (beyond the old output's text)


def propose_jump(state: ConstraintState, output_ids: list[int]) -> JumpForward | None:
    """The jump from the end of output_ids (the tokens `state` has walked), or None."""
    if len(output_ids) != state.num_tokens:
        raise ValueError(f"{len(output_ids)} output ids, but the constraint state walked {state.num_tokens}")
    compiled = state.compiled
    vocab = compiled.vocab
    if state.is_terminated():
        return None
    forced = compiled.byte_dfa.forced.get(state.byte_states[-1])
    if not forced:
        return None
    ids = output_ids
    start = _window_start(ids, vocab.token_bytes)
    old = b"".join(vocab.token_bytes[t] for t in ids[start:])
    full = _complete_utf8_prefix(old + forced)
    if full is None or len(full) <= len(old):
        return None
    tail = _encode_exact(vocab.tokenizer, vocab.token_bytes, full)
    if tail is None:
        return None
    kept = _stable_prefix(compiled, state.token_states[start], tail, full, len(old))
    if not kept:
        return None
    new_tail = tail[:kept]
    # the old output may end inside a character the jump completes: count whole characters
    old_text = _complete_utf8_prefix(old).decode("utf-8")
    jumped = b"".join(vocab.token_bytes[t] for t in new_tail).decode("utf-8")[len(old_text):]
    if len(jumped) < MIN_JUMP_CHARS:
        return None
    keep_len = start + _common_prefix(ids[start:], new_tail)
    return JumpForward(new_output_ids=ids[:start] + new_tail, keep_len=keep_len, jumped_text=jumped)


def _window_start(ids: list[int], token_bytes) -> int:
    start = max(0, len(ids) - RETOKENIZE_WINDOW)
    while start > 0 and 0x80 <= token_bytes[ids[start]][0] < 0xC0:  # inside a UTF-8 character
        start -= 1
    return start


def _complete_utf8_prefix(data: bytes) -> bytes | None:
    for cut in range(4):  # a UTF-8 character is at most 4 bytes
        try:
            (data[: len(data) - cut] if cut else data).decode("utf-8")
            return data[: len(data) - cut] if cut else data
        except UnicodeDecodeError:
            continue
    return None


def _spells(ids: list[int], token_bytes, data: bytes) -> bool:
    parts = [token_bytes[t] if t < len(token_bytes) else None for t in ids]
    return None not in parts and b"".join(parts) == data


def _encode_exact(tokenizer, token_bytes, data: bytes) -> list[int] | None:
    """Encode `data` with the model's tokenizer so the ids spell exactly `data`. SentencePiece
    tokenizers prepend a space at the start of a text, so a newline anchor is tried as well."""
    text = data.decode("utf-8")
    ids = tokenizer.encode(text, add_special_tokens=False)
    if _spells(ids, token_bytes, data):
        return ids
    anchor = tokenizer.encode("\n", add_special_tokens=False)
    ids = tokenizer.encode("\n" + text, add_special_tokens=False)
    if ids[: len(anchor)] == anchor and _spells(ids[len(anchor) :], token_bytes, data):
        return ids[len(anchor) :]
    return None


def _stable_prefix(compiled, token_state: int, tail: list[int], full: bytes, old_len: int) -> int:
    """How many ids of `tail` to keep: up to the last stable boundary inside the forced text."""
    token_bytes = compiled.vocab.token_bytes
    states, ends, end = [token_state], [], 0
    for tid in tail:
        nxt = compiled.next_state(states[-1], tid)
        if nxt is None:
            return 0
        states.append(nxt)
        end += len(token_bytes[tid])
        ends.append(end)
    for i in range(len(tail) - 1, -1, -1):
        if ends[i] <= old_len:
            return 0
        if _complete_utf8_prefix(full[: ends[i]]) != full[: ends[i]]:
            continue
        longer = compiled.vocab.extensions(token_bytes[tail[i]])
        if longer.numel() and bool(compiled.mask(states[i])[longer].any()):
            continue
        return i + 1
    return 0


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
