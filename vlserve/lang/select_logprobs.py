"""select on vlserve's runtime: every choice scored from the cached prefix in one batched request.

1. The prefix's token count P: known when nothing was appended since the state's last runtime answer
   (a gen, a commit or a select, whose tokens are in the cache); else the prefix is committed with
   max_new_tokens=0 (which caches the new text once, not once per choice) and reports P.
2. One batch: the prefix alone and prefix+choice for every choice, max_new_tokens=0, prompt logprobs
   from position P - window. Appending a choice can re-tokenise the prefix's last tokens, so the
   choice's tokens start where its token ids first differ from the prefix's own (found by
   tokenising both, in the server); a window that holds no common token is doubled and retried.
3. unconditional_likelihood_normalized only: the choices' token ids alone, scored from position 0
   (whose first entry has no logprob: None).
"""

import os

WINDOW = 4


def choice_token_logprobs(prefix_items: list, full_items: list) -> tuple[list[list], int]:
    """The (logprob, id) items of the choice's own tokens, and how many leading items it shares."""
    shared = len(os.path.commonprefix([[i[1] for i in prefix_items], [i[1] for i in full_items]]))
    return [[item[0], item[1]] for item in full_items[shared:]], shared


def score_choices(call, prompt_of, text: str, media: list, choices: list[str],
                  known_tokens: int | None = None) -> tuple[list[list], list[dict]]:
    """Each choice's (logprob, id) items, and the batch's answers (prefix first)."""
    n_prefix = known_tokens
    if n_prefix is None:
        commit = call({**prompt_of(text, media), "sampling_params": {"max_new_tokens": 0}})
        n_prefix = commit["meta_info"]["prompt_tokens"]
    window = WINDOW
    while True:
        start = max(n_prefix - window, 0)
        results = call({**prompt_of([text] + [text + c for c in choices], media, batch=True),
                        "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                        "logprob_start_len": start})
        prefix_items = results[0]["meta_info"]["input_token_logprobs"]
        scored = [choice_token_logprobs(prefix_items, r["meta_info"]["input_token_logprobs"]) for r in results[1:]]
        if start == 0 or all(shared > 0 for _, shared in scored):
            break
        window *= 2
    for choice, (tokens, _) in zip(choices, scored):
        if not tokens:
            raise ValueError(f"select: the choice {choice!r} adds no token to the prompt")
    return [tokens for tokens, _ in scored], results


def unconditional_logprobs(call, choice_tokens: list[list]) -> list[list]:
    """Each choice's tokens scored with no context; the first has none (None)."""
    results = call({"input_ids": [[item[1] for item in tokens] for tokens in choice_tokens],
                    "sampling_params": {"max_new_tokens": 0}, "return_logprob": True, "logprob_start_len": 0})
    return [[[item[0], item[1]] for item in r["meta_info"]["input_token_logprobs"]] for r in results]


def select_choice(call, prompt_of, s, choices: list[str], method):
    """The decision; s.token_mark is used (a known prefix length) and moved past the chosen text."""
    exact = s.token_mark is not None and s.token_mark[0] == len(s.text_)  # nothing appended since
    known = s.token_mark[1] if exact else None
    tokens, results = score_choices(call, prompt_of, s.text_, s.media, choices, known)
    normalized = [sum(item[0] for item in t) / len(t) for t in tokens]
    unconditional = unconditional_logprobs(call, tokens) if method.requires_unconditional_logprobs else None
    decision = method(choices=choices, normalized_prompt_logprobs=normalized, input_token_logprobs=tokens,
                      output_token_logprobs=[[] for _ in choices], unconditional_token_logprobs=unconditional)
    chosen = results[1 + choices.index(decision.decision)]["meta_info"]["prompt_tokens"]
    s.token_mark = (len(s.text_) + len(decision.decision), chosen)
    return decision
