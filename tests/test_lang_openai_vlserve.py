"""The OpenAI backend against vlserve's own OpenAI-compatible routes (the built-in model)."""

import pytest

import vlserve.lang as sgl
from helpers.lang_helpers import builtin_server, scene_png
from helpers.server_helpers import assert_leak_free
from vlserve.builtin import scenes


@pytest.fixture(scope="module")
def url():
    engine, server = builtin_server()
    yield server.url + "/v1"
    assert_leak_free(engine, server.url)
    server.stop()
    engine.shutdown()


def caption_fields(s):
    # The built-in model, asked for a caption with no picture, still finishes one in its own form when
    # it is begun far enough: after "A red square, a blue circle, a green" it goes on " triangle and a
    # purple triangle." - so "first" is the green shape's kind, "second" the shape after " and". (Begun
    # with fewer words, a checkpoint may drift into an answer to another question: the picture it was
    # asked about is missing; stage 17, asked "What is in the image?", goes on " triangle and aI can only
    # see ...", so the question is one it finishes in form.)
    s += "USER: Describe the picture. ASSISTANT: A red square, a blue circle, a green"
    s += sgl.gen("first", stop=" and") + " and" + sgl.gen("second", stop=".") + "."


def _names_a_shape(text: str) -> bool:
    words = text.split()
    return any(c in words for c in scenes.COLOURS) and any(s.rstrip("s") in scenes.SHAPES for s in words)


def _completion_backend(url):
    return sgl.OpenAI("vlserve-builtin", is_chat_model=False, base_url=url, api_key="unused",
                      chat_template=sgl.get_chat_template("vicuna_v1.1"))


def test_speculation_cuts_calls_and_billed_prompt_tokens_on_vlserve_completions(url):
    plain, spec = _completion_backend(url), _completion_backend(url)
    without = sgl.function(caption_fields).run(temperature=0, backend=plain)
    with_spec = sgl.function(num_api_spec_tokens=32)(caption_fields).run(temperature=0, backend=spec)

    variables = ("first", "second")
    assert {k: with_spec[k] for k in variables} == {k: without[k] for k in variables}
    # the template's words: a kind after "a green", then a colour and a kind
    assert _names_a_shape("green" + without["first"]) and _names_a_shape(without["second"]), without
    assert (plain.token_usage.calls, spec.token_usage.calls) == (2, 1)
    assert 2 * spec.token_usage.prompt_tokens < plain.token_usage.prompt_tokens


@sgl.function
def chat_about(s, picture, question):
    s += sgl.user(sgl.image(picture) + question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=8))


def test_chat_model_with_an_image_answers_and_counts_usage(url):
    picture, qas = scene_png(5)
    backend = sgl.OpenAI("vlserve-builtin", base_url=url, api_key="unused",
                         chat_template=sgl.get_chat_template("vicuna_v1.1"))
    states = chat_about.run_batch([{"picture": picture, "question": qa.question} for qa in qas[:3]],
                                  temperature=0, backend=backend)
    right = sum(s["answer"].strip() == qa.answer for s, qa in zip(states, qas[:3]))
    assert right >= 2, [s["answer"] for s in states]  # not always right (docs/builtin-model.md); blind it would be
    assert states[0].messages()[0]["content"][0]["type"] == "image_url"
    assert backend.token_usage.calls == 3 and backend.token_usage.prompt_tokens > 3 * 36  # 36 image tokens each

    streamed = chat_about.run(picture=picture, question=qas[0].question, temperature=0, stream=True,
                              backend=backend)
    assert "".join(streamed.text_iter("answer")) == streamed["answer"] == states[0]["answer"]


def test_gen_after_text_in_a_chat_turn_needs_speculation(url):
    @sgl.function
    def midway(s):
        s += sgl.user("Count the circles.")
        s += sgl.assistant("There are" + sgl.gen("n", max_tokens=4))

    state = midway.run(backend=sgl.OpenAI("vlserve-builtin", base_url=url, api_key="unused"))
    with pytest.raises(RuntimeError, match="num_api_spec_tokens"):
        state["n"]
