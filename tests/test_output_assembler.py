"""OutputAssembler: the final result built from all of a request's steps at once (`final`, what
non-streamed callers use) equals the last chunk of step-by-step updates, while decoding the text
once instead of once per step."""

from transformers import AutoTokenizer

from vlserve.model.builtin import builtin_model_path
from vlserve.core.request import StepOutput
from vlserve.engine.output import OutputAssembler

TOKENIZER = AutoTokenizer.from_pretrained(builtin_model_path())


class CountingTokenizer:
    def __init__(self, inner):
        self.inner, self.decodes = inner, 0

    def decode(self, ids, **kw):
        self.decodes += 1
        return self.inner.decode(ids, **kw)


def steps_of(text: str, replace: tuple[int, list[int]] | None = None) -> list[StepOutput]:
    ids = TOKENIZER(text, add_special_tokens=False)["input_ids"]
    outs = [StepOutput("r", [t], [-0.5 - i], False) for i, t in enumerate(ids)]
    if replace is not None:  # a jump-forward retokenisation: ids from `at` on become `new`
        at, new = replace
        outs.append(StepOutput("r", new, [-0.1] * len(new), False, replace_from=at))
    outs.append(StepOutput("r", [], [], True, finish_reason="stop", meta={"completion_tokens": 99}))
    return outs


def incremental(outs: list[StepOutput], stop: list[str]) -> dict:
    assembler = OutputAssembler(TOKENIZER, stop, return_logprob=True)
    chunk = None
    for out in outs:
        chunk = assembler.update(out)
    return chunk


def test_final_equals_the_last_incremental_chunk():
    outs = steps_of("a red circle on a blue square")
    want = incremental(outs, [])
    got = OutputAssembler(TOKENIZER, [], return_logprob=True).final(outs)
    assert got["text"] == want["text"] == TOKENIZER.decode(want["output_ids"], skip_special_tokens=True)
    assert got["output_ids"] == want["output_ids"] and len(got["output_ids"]) == len(outs) - 1
    assert got["meta_info"] == want["meta_info"]
    assert got["meta_info"]["output_token_logprobs"][0] == (-0.5, want["output_ids"][0])
    assert got["finished"] is True and got["meta_info"]["completion_tokens"] == 99


def test_final_cuts_at_a_stop_string():
    outs = steps_of("a red circle. a blue square")
    got = OutputAssembler(TOKENIZER, ["."]).final(outs)
    assert got["text"] == incremental(outs, ["."])["text"] == "a red circle"


def test_final_applies_a_retokenisation():
    ids = TOKENIZER("a red circle", add_special_tokens=False)["input_ids"]
    new = TOKENIZER(" square", add_special_tokens=False)["input_ids"]
    outs = steps_of("a red circle", replace=(len(ids) - 1, new))
    got = OutputAssembler(TOKENIZER, [], return_logprob=True).final(outs)
    assert got["output_ids"] == ids[:-1] + new
    assert len(got["meta_info"]["output_token_logprobs"]) == len(ids) - 1 + len(new)
    assert got["text"] == TOKENIZER.decode(ids[:-1] + new, skip_special_tokens=True)


def test_final_decodes_once():
    outs = steps_of("a red circle on a blue square")
    counting = CountingTokenizer(TOKENIZER)
    OutputAssembler(counting, []).final(outs)
    assert counting.decodes == 1
    counting.decodes = 0
    assembler = OutputAssembler(counting, [])
    for out in outs:
        assembler.update(out)
    assert counting.decodes == len(outs)
