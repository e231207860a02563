"""API speculative execution for completion models (paper §5): one call speculates past a gen's stop;
later gens and constant text consume the speculated text while it matches.

Speculation belongs to one program state (its executor), so states running side by side under
run_batch never see each other's text. Token limits are counted in tokens: a piece of the speculated
text has at most as many tokens as the call that produced it, and otherwise the backend's tokenizer
counts them; without a tokenizer an undecidable value is left to an ordinary call.
"""

from dataclasses import dataclass


@dataclass
class Speculation:
    text: str = ""  # speculated continuation of the state's true text, not yet consumed
    max_tokens: int = 0  # tokens of the call that produced it (an upper bound for any piece of it)
    ended: bool = False  # that call ended by itself (EOS), not at its token limit

    def clear(self) -> None:
        self.text, self.max_tokens, self.ended = "", 0, False

    def fill(self, text: str, completion_tokens: int, ended: bool) -> None:
        self.text, self.max_tokens, self.ended = text, completion_tokens, ended

    def consume_text(self, value: str) -> None:
        """Constant text: consumed while the speculation agrees; any mismatch drops the speculation."""
        if value and self.text.startswith(value):
            self.text = self.text[len(value):]
        elif value:
            self.clear()

    def take(self, stop: list[str], max_tokens: int, tokenizer=None) -> str | None:
        """The next gen's value, if the speculation decides it; else None (the caller calls the API)."""
        if not self.text:
            return None
        cut = min((p for p in (self.text.find(s) for s in stop) if p >= 0), default=-1)
        value = self.text[:cut] if cut >= 0 else self.text
        if self.max_tokens > max_tokens:
            if tokenizer is None:
                return None
            limited = first_tokens(tokenizer, value, max_tokens)
            if limited is None:
                return None
            if limited != value:
                value, cut = limited, len(limited)
        if cut < 0 and not self.ended and value == self.text:
            return None  # the speculation ran out before the gen would have stopped
        self.text = self.text[len(value):]
        return value


def first_tokens(tokenizer, text: str, n: int) -> str | None:
    """text cut to its first n tokens (the whole text if shorter); None if the cut is not a prefix."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= n:
        return text
    head = tokenizer.decode(ids[:n])
    return head if text.startswith(head) else None


def spec_max_tokens(num_api_spec_tokens: int, gen_max_tokens: int, has_stop: bool) -> int:
    """A gen with a stop speculates num_api_spec_tokens; one without needs at least its own length."""
    return num_api_spec_tokens if has_stop else max(num_api_spec_tokens, gen_max_tokens)
