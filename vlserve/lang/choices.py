"""How select picks among choices, from the logprobs of each choice's own tokens.

Each `input_token_logprobs[i]` is the list of (logprob, token_id) of choice i's tokens after the
prefix. The scoring rules are pure functions; the method objects (SGLang's names) wrap them.
A logprob of exactly 0.0 is a real value (a certain token) and counts like any other.
"""

from dataclasses import dataclass
from typing import Any


@dataclass
class ChoicesDecision:
    decision: str
    meta_info: dict | None = None


def argmax_first(values: list[float]) -> int:
    if not values:
        raise ValueError("argmax of an empty sequence")
    return max(range(len(values)), key=values.__getitem__)


def mean_logprob(token_logprobs: list) -> float:
    if not token_logprobs:
        raise ValueError("a choice with no tokens has no score")
    return sum(lp for lp, *_ in token_logprobs) / len(token_logprobs)


def greedy_token_matrix(input_token_logprobs: list[list]) -> list[list[float]]:
    """Each choice's logprobs, the shorter ones padded with their own mean to the longest length."""
    width = max(len(tokens) for tokens in input_token_logprobs)
    rows = []
    for tokens in input_token_logprobs:
        values = [lp for lp, *_ in tokens]
        rows.append(values + [mean_logprob(tokens)] * (width - len(values)))
    return rows


def greedy_token_index(input_token_logprobs: list[list]) -> int:
    """Token by token, keep only the choices with the best logprob at that position; first survivor wins."""
    matrix = greedy_token_matrix(input_token_logprobs)
    remaining = list(range(len(matrix)))
    for j in range(len(matrix[0])):
        best = max(matrix[i][j] for i in remaining)
        remaining = [i for i in remaining if matrix[i][j] == best]
        if len(remaining) == 1:
            break
    return remaining[0]


def unconditional_normalized_scores(input_token_logprobs: list[list],
                                    unconditional_token_logprobs: list[list]) -> list[float]:
    """Mean over a choice's tokens of logprob(token | prefix) - logprob(token | choice alone).

    The first unconditional logprob has no context (None) and counts as 0."""
    scores = []
    for inputs, uncond in zip(input_token_logprobs, unconditional_token_logprobs):
        if len(inputs) != len(uncond):
            raise ValueError("conditional and unconditional logprobs cover different numbers of tokens")
        base = [0.0 if i == 0 and u[0] is None else u[0] for i, u in enumerate(uncond)]
        scores.append(sum(lp[0] - b for lp, b in zip(inputs, base)) / len(inputs))
    return scores


class ChoicesSamplingMethod:
    requires_unconditional_logprobs = False

    def __call__(self, *, choices: list[str], normalized_prompt_logprobs: list[float],
                 input_token_logprobs: list[list], output_token_logprobs: list[list],
                 unconditional_token_logprobs: list[list] | None = None) -> ChoicesDecision:
        raise NotImplementedError


def _meta(normalized, inputs, outputs, **extra) -> dict[str, Any]:
    return {"normalized_prompt_logprobs": normalized, "input_token_logprobs": inputs,
            "output_token_logprobs": outputs, **extra}


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The choice with the highest mean token logprob."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None):
        best = choices[argmax_first(normalized_prompt_logprobs)]
        return ChoicesDecision(best, _meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs))


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Greedy decoding restricted to the choices (a shorter choice continues with its mean)."""

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None):
        best = choices[greedy_token_index(input_token_logprobs)]
        meta = _meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                     greedy_logprob_matrix=greedy_token_matrix(input_token_logprobs))
        return ChoicesDecision(best, meta)


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """The choice whose tokens gain the most from the prefix over their likelihood alone."""
    requires_unconditional_logprobs = True

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None):
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional token logprobs are required for this method")
        scores = unconditional_normalized_scores(input_token_logprobs, unconditional_token_logprobs)
        meta = _meta(normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                     unconditional_token_logprobs=unconditional_token_logprobs,
                     normalized_unconditional_prompt_logprobs=scores)
        return ChoicesDecision(choices[argmax_first(scores)], meta)


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
