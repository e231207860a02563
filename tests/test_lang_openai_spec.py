"""API speculative execution against the scripted OpenAI-compatible fake, which counts calls."""

import pytest

import vlserve.lang as sgl
from helpers.lang_helpers import AppServer
from helpers.openai_fake import OpenAIFake, WordTokenizer

INTRO = "Construct a character within the following format:\nName: Steve Jobs.\nBirthday: February 24, 1955.\n" \
        "Job: Apple CEO.\n\nPlease generate new Name, Birthday and Job.\n"
DOCS = [INTRO + f"Character {i}.\nName: Ferris Bueller {i}\nBirthday: June {i + 11}, 1986\nJob: Student of {i}\n\n"
        f"That is all." for i in range(4)]


def character(s, i, third="Job"):
    s += INTRO + f"Character {i}.\n"
    s += "Name:" + sgl.gen("name", stop="\n") + "\nBirthday:" + sgl.gen("birthday", stop="\n")
    s += f"\n{third}:" + sgl.gen("job", stop="\n") + "\n"


plain = sgl.function(character)
speculative = sgl.function(num_api_spec_tokens=64)(character)


def _backend(fake_server, **kwargs):
    return sgl.OpenAI("fake", is_chat_model=False, base_url=fake_server.url + "/v1", api_key="k", **kwargs)


def _variables(state):
    return {k: state[k] for k in ("name", "birthday", "job")}


def test_three_gens_take_one_call_with_speculation_and_three_without():
    fake = OpenAIFake(DOCS)
    with AppServer(fake.app) as server:
        without = plain.run(i=1, temperature=0, backend=_backend(server))
        assert fake.calls == 3
        billed_without, fake.calls, fake.prompt_tokens = fake.prompt_tokens, 0, 0
        backend = _backend(server)
        with_spec = speculative.run(i=1, temperature=0, backend=backend)
        assert fake.calls == 1
    assert _variables(with_spec) == _variables(without) == {
        "name": " Ferris Bueller 1", "birthday": " June 12, 1986", "job": " Student of 1"}
    assert with_spec.text() == without.text()
    assert backend.token_usage.calls == 1 and backend.token_usage.prompt_tokens == fake.prompt_tokens
    assert 3 * fake.prompt_tokens < billed_without  # each gen re-sent the whole prompt without speculation


def test_a_mismatching_constant_falls_back_to_a_call_from_the_true_prefix():
    fake = OpenAIFake(DOCS)
    with AppServer(fake.app) as server:
        without = plain.run(i=2, third="Hobby", temperature=0, backend=_backend(server))
        fake.calls = 0
        with_spec = speculative.run(i=2, third="Hobby", temperature=0, backend=_backend(server))
        assert fake.calls == 2  # the speculation covered name and birthday; "Hobby:" did not match
    assert _variables(with_spec) == _variables(without)
    assert with_spec["job"] == " unknown" and with_spec["birthday"] == " June 13, 1986"


def test_speculation_belongs_to_each_state_under_run_batch():
    fake = OpenAIFake(DOCS)
    with AppServer(fake.app) as server:
        states = speculative.run_batch([{"i": i} for i in range(4)], temperature=0, backend=_backend(server),
                                       num_threads=4)
        assert fake.calls == 4  # one per program (an OpenAI API has no cache for run_batch to warm)
    assert [s["name"] for s in states] == [f" Ferris Bueller {i}" for i in range(4)]
    assert [s["job"] for s in states] == [f" Student of {i}" for i in range(4)]


def test_max_tokens_are_counted_in_tokens():
    @sgl.function(num_api_spec_tokens=64)
    def short_name(s):
        s += DOCS[3][:DOCS[3].rindex("Name:") + len("Name:")]
        s += sgl.gen("name", max_tokens=2, stop="\n") + sgl.gen("rest", stop="\n")

    fake = OpenAIFake(DOCS)
    with AppServer(fake.app) as server:
        counted = short_name.run(temperature=0, backend=_backend(server, tokenizer=WordTokenizer()))
        assert fake.calls == 1
        fake.calls = 0
        uncounted = short_name.run(temperature=0, backend=_backend(server))  # no tokenizer: ordinary calls
        assert fake.calls > 1
    assert counted["name"] == uncounted["name"] == " Ferris Bueller"
    assert counted["rest"] == uncounted["rest"] == " 3"


SHEET = {"Name:": " Ferris", "Birthday:": " June 11", "Job:": " Student"}


@sgl.function(num_api_spec_tokens=32)
def chat_character(s):
    s += sgl.user("Make up a character.")
    s += sgl.assistant("Name:" + sgl.gen("name", stop="\n") + "\nBirthday:" + sgl.gen("birthday", stop="\n")
                       + "\nJob:" + sgl.gen("job", stop="\n"))


@pytest.mark.parametrize("broken, calls", [(False, 1), (True, 3 + 3)])
def test_chat_template_is_filled_from_one_call_or_falls_back(broken, calls):
    fake = OpenAIFake([], sheet=SHEET, broken=broken)
    with AppServer(fake.app) as server:
        backend = sgl.OpenAI("fake", is_chat_model=True, base_url=server.url + "/v1", api_key="k")
        state = chat_character.run(temperature=0, backend=backend)
        assert _variables(state) == {"name": " Ferris", "birthday": " June 11", "job": " Student"}
        assert fake.calls == calls
    assert state.messages()[-1] == {"role": "assistant", "content": "Name: Ferris\nBirthday: June 11\nJob: Student"}
