"""API speculative execution for chat models: an assistant turn written as constants and gens is
filled from one chat call whose answer is matched against that template."""

from dataclasses import dataclass, field


@dataclass
class Term:
    text: str  # a constant's text, or a gen's value once matched
    name: str | None = None
    stop: list[str] = field(default_factory=list)
    params: object = None  # a gen's SglSamplingParams; None for constants

    @property
    def is_gen(self) -> bool:
        return self.params is not None


@dataclass
class ChatSpecTurn:
    terms: list[Term] = field(default_factory=list)

    def add_text(self, value: str) -> None:
        if value:
            self.terms.append(Term(value))

    def add_gen(self, name: str | None, params) -> None:
        self.terms.append(Term("", name, params.stop_list(), params))

    def gens(self) -> list[Term]:
        return [t for t in self.terms if t.is_gen]

    def match(self, answer: str) -> bool:
        """Fills the gens from answer if it follows the template; False (nothing filled) otherwise."""
        values = match_template(self.terms, answer)
        if values is None:
            return False
        for term, value in zip(self.gens(), values):
            term.text = value
        return True

    def text(self) -> str:
        return "".join(t.text for t in self.terms)

    def take_variables(self) -> list[tuple[str, str]]:
        out = [(t.name, t.text) for t in self.terms if t.is_gen and t.name is not None]
        self.terms = []
        return out


def match_template(terms: list[Term], answer: str) -> list[str] | None:
    """Each gen's value: up to its stop, or (no stop) up to the next constant; the last takes the rest."""
    values, rest = [], answer
    for i, term in enumerate(terms):
        if not term.is_gen:
            if not rest.startswith(term.text):
                return None
            rest = rest[len(term.text):]
            continue
        following = terms[i + 1].text if i + 1 < len(terms) and not terms[i + 1].is_gen else None
        delimiters = term.stop or ([following] if following else [])
        cut = min((p for p in (rest.find(d) for d in delimiters) if p >= 0), default=-1)
        if cut < 0 and i != len(terms) - 1:
            return None
        values.append(rest if cut < 0 else rest[:cut])
        rest = "" if cut < 0 else rest[cut:]
    return values
