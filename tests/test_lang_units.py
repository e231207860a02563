"""The language's pure parts: choice methods, the token boundary, speculation, template matching,
tracing, expressions."""

import math
import re

import pytest

import vlserve.lang as sgl
from vlserve.lang.chat_spec import Term, match_template
from vlserve.lang.choices import (greedy_token_index, greedy_token_matrix, mean_logprob,
                                  unconditional_normalized_scores)
from vlserve.lang.ir import SglGen, SglSelect, default_sampling_params
from vlserve.lang.select_logprobs import choice_token_logprobs
from vlserve.lang.spec import Speculation


def _call(method, rows, uncond=None):
    return method(choices=[f"c{i}" for i in range(len(rows))],
                  normalized_prompt_logprobs=[mean_logprob(r) for r in rows], input_token_logprobs=rows,
                  output_token_logprobs=[[] for _ in rows], unconditional_token_logprobs=uncond).decision


def test_token_length_normalised_keeps_zero_logprobs():
    rows = [[[0.0, 5], [-1.0, 6]], [[-0.6, 7]]]  # mean -0.5 (dropping the 0.0 would make it -1.0)
    assert _call(sgl.token_length_normalized, rows) == "c0"
    assert _call(sgl.token_length_normalized, [[[-0.1, 1]], [[0.0, 2]]]) == "c1"


def test_greedy_token_selection_breaks_ties_on_later_tokens_and_pads_with_the_mean():
    rows = [[[-1.0, 1], [-3.0, 2]], [[-1.0, 1], [-0.5, 3], [-9.0, 4]], [[-2.0, 9]]]
    assert greedy_token_index(rows) == 1
    assert greedy_token_matrix([[[-1.0, 1]], [[-2.0, 1], [-4.0, 2]]]) == [[-1.0, -1.0], [-2.0, -4.0]]
    assert _call(sgl.greedy_token_selection, [[[-2.0, 1]], [[-2.0, 1], [-1.0, 2]]]) == "c1"
    assert _call(sgl.greedy_token_selection, [[[0.0, 1]], [[-0.5, 1]]]) == "c0"


def test_unconditional_normalised_scores():
    inputs = [[[-1.0, 1], [-1.0, 2]], [[-0.5, 3], [0.0, 4]]]
    uncond = [[[None, 1], [-3.0, 2]], [[None, 3], [0.0, 4]]]
    assert unconditional_normalized_scores(inputs, uncond) == [(-1.0 + 2.0) / 2, -0.25]
    assert _call(sgl.unconditional_likelihood_normalized, inputs, uncond) == "c0"
    with pytest.raises(ValueError):
        unconditional_normalized_scores([[[-1.0, 1]]], [[[None, 1], [-1.0, 2]]])
    with pytest.raises(ValueError):
        _call(sgl.unconditional_likelihood_normalized, inputs)


def test_choice_tokens_start_where_the_token_ids_diverge():
    prefix = [[-0.1, 10], [-0.2, 11], [-0.3, 12]]
    retokenised = [[-0.1, 10], [-0.2, 11], [-0.7, 13], [-0.9, 14]]  # the prefix's last token merged
    tokens, shared = choice_token_logprobs(prefix, retokenised)
    assert (tokens, shared) == ([[-0.7, 13], [-0.9, 14]], 2)
    clean = prefix + [[0.0, 20]]
    assert choice_token_logprobs(prefix, clean) == ([[0.0, 20]], 3)


def test_speculation_serves_gens_and_constants_while_they_match():
    spec = Speculation()
    spec.fill(" Ferris\nBirthday: June\nJob: Student\n", completion_tokens=8, ended=True)
    assert spec.take(["\n"], 128) == " Ferris"
    spec.consume_text("\nBirthday:")
    assert spec.take(["\n"], 128) == " June"
    spec.consume_text("\nHobby:")  # mismatch: the speculation is dropped
    assert spec.text == "" and spec.take(["\n"], 128) is None


def test_speculation_that_runs_out_leaves_the_gen_to_a_call():
    spec = Speculation()
    spec.fill(" a long name without end", completion_tokens=5, ended=False)
    assert spec.take(["\n"], 128) is None
    spec.fill(" short", completion_tokens=1, ended=True)  # ended by itself: the gen ends there too
    assert spec.take(["\n"], 128) == " short"


class Words:
    def encode(self, text, add_special_tokens=False):
        return re.findall(r"\s*\S+", text)

    def decode(self, ids):
        return "".join(ids)


def test_speculation_counts_max_tokens_in_tokens():
    spec = Speculation()
    spec.fill(" one two three four\nrest", completion_tokens=6, ended=False)
    assert spec.take(["\n"], 2) is None  # cannot count without a tokenizer
    assert spec.take(["\n"], 2, Words()) == " one two"
    assert spec.take(["\n"], 5, Words()) == " three four"
    assert spec.text == "\nrest"


def test_chat_template_matching():
    gen = lambda name, stop=None: Term("", name, stop or [], params=object())  # noqa: E731
    terms = [Term("Name:"), gen("name", ["\n"]), Term("\nAge:"), gen("age", ["\n"])]
    assert match_template(terms, "Name: Bob\nAge: 42") == [" Bob", " 42"]
    assert match_template(terms, "name = Bob, age = 42") is None
    assert match_template(terms, "Name: Bob, Age: 42") is None
    no_stop = [Term("A:"), gen("a"), Term(" B:"), gen("b")]
    assert match_template(no_stop, "A: x y B: z") == [" x y", " z"]


def test_tracing_stops_at_the_first_argument_or_model_call():
    @sgl.function
    def program(s, question):
        s += "Answer briefly.\n"
        s += sgl.user("Q: " + question)
        s += sgl.assistant(sgl.gen("a"))

    @sgl.function
    def constant_until_gen(s, question):
        s += sgl.system("Be brief.") + "Q: 1+1? A:" + sgl.gen("x")
        s += question

    backend = sgl.RuntimeEndpoint("http://127.0.0.1:9")  # tracing sends nothing
    assert program.trace(backend).text == "Answer briefly.\n"
    assert constant_until_gen.trace(backend).text == "Be brief. Q: 1+1? A:"


def test_expressions_and_sampling_params():
    assert isinstance(sgl.gen("c", choices=["a", "b"]), SglSelect)
    g = sgl.gen_int("n", max_tokens=4)
    assert isinstance(g, SglGen) and re.fullmatch(g.sampling_params.to_runtime()["regex"], "-12")
    merged = sgl.gen("x", stop="\n", temperature=0).sampling_params.merged_over(default_sampling_params())
    assert merged.to_runtime() == {"max_new_tokens": 128, "stop": ["\n"], "stop_token_ids": [], "temperature": 0,
                                   "top_p": 1.0, "top_k": -1, "min_p": 0.0, "ignore_eos": False}
    assert merged.to_openai() == {"max_tokens": 128, "stop": ["\n"], "temperature": 0, "top_p": 1.0}
    with pytest.raises(re.error):
        sgl.gen("x", regex="(")
    assert math.isclose(mean_logprob([[0.0, 1], [-1.0, 2]]), -0.5)
