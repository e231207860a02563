"""SGLang's own frontend against vlserve: the `sglang` package from PyPI (the version scripts/run.sh
setup pins, unmodified) and vlserve's `vlserve.lang` run the same programs, through their
RuntimeEndpoint, against one real server on the built-in model, and get the right answers: gen with
stop and max_tokens, a multi-turn chat with an image, select over a picture with every choices_method,
fork/join (indexing, `forks[i] += …`, iteration, both join modes), run_batch, regex, streaming,
logprobs, flush_cache and server_info.

SGLang's RuntimeEndpoint reads /get_model_info's model_path to choose its chat template (vicuna_v1.1
for the built-in model, with its default system prompt); vlserve.lang's uses VICUNA without one.
"""

import re
from types import SimpleNamespace

import httpx
import pytest

import vlserve.lang
from helpers.lang_helpers import scene_png, served  # noqa: F401 - served is a fixture

COLOURS = [" Red", " Green", " Blue", " Yellow", " Purple", " Orange"]
METHODS = ["token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized"]


def import_sglang():
    try:
        import sglang
    except ImportError as e:  # a missing client is a broken setup, never a skip
        pytest.fail(f"`import sglang` failed ({e}): SGLang's frontend client is part of the test setup; "
                    "`bash scripts/run.sh setup` installs it (sglang --no-deps and what its import needs)")
    return sglang


@pytest.fixture(params=["sglang", "vlserve"])
def frontend(request, served):
    """The frontend module (imported as sgl), its backend on the server, and the programs written with it."""
    sgl = import_sglang() if request.param == "sglang" else vlserve.lang
    backend = sgl.RuntimeEndpoint(served[1].url)
    return SimpleNamespace(name=request.param, sgl=sgl, backend=backend, programs=programs(sgl))


_programs: dict = {}


def programs(sgl) -> SimpleNamespace:
    """Every program of these tests, written once for either frontend."""
    if sgl.__name__ in _programs:
        return _programs[sgl.__name__]

    @sgl.function
    def ask(s, picture, question, limit=16, stop_at=(), regex=None, logprobs=False):
        s += sgl.user(sgl.image(picture) + question)
        extra = dict(return_logprob=True, logprob_start_len=0, top_logprobs_num=2,
                     return_text_in_logprobs=True) if logprobs else {}
        s += sgl.assistant(sgl.gen("answer", max_tokens=limit, stop=list(stop_at), regex=regex, **extra))

    @sgl.function
    def chat(s, picture, first, second):
        s += sgl.user(sgl.image(picture) + first)
        s += sgl.assistant(sgl.gen("first", max_tokens=16))
        s += sgl.user(second)
        s += sgl.assistant(sgl.gen("second", max_tokens=16))

    @sgl.function
    def pick(s, picture, question, method):
        s += sgl.user(sgl.image(picture) + question)
        s += sgl.assistant(sgl.select("colour", choices=COLOURS, choices_method=getattr(sgl, method)))

    @sgl.function
    def fork_all(s, picture, questions):
        s += sgl.user_begin() + sgl.image(picture)
        forks = s.fork(len(questions))
        forks += lambda i: questions[i] + sgl.user_end() + sgl.assistant(sgl.gen("answer", max_tokens=16))
        forks.join()

    @sgl.function
    def fork_by_index(s, picture, questions):
        s += sgl.user_begin() + sgl.image(picture)
        forks = s.fork(len(questions))
        for i in range(len(questions)):
            forks[i] += questions[i] + sgl.user_end()
            forks[i] += sgl.assistant(sgl.gen("answer", max_tokens=16))
        s["in_order"] = [branch["answer"] for branch in forks]  # iteration and indexing
        forks.join("gather_variable")

    @sgl.function
    def fork_and_append(s, picture, question, follow_ups):
        s += sgl.user(sgl.image(picture) + question) + sgl.assistant(sgl.gen("first", max_tokens=16))
        forks = s.fork(len(follow_ups))
        forks += [sgl.user(q) + sgl.assistant(sgl.gen("answer", max_tokens=16)) for q in follow_ups]
        s["prefix"], s["branches"] = s.text(), [branch.text() for branch in forks]
        forks.join("concate_and_append")

    @sgl.function
    def replace_branch(s):
        forks = s.fork(2)
        forks[0] = forks[1]  # a branch can be appended to, never replaced

    _programs[sgl.__name__] = SimpleNamespace(ask=ask, chat=chat, pick=pick, fork_all=fork_all,
                                              fork_by_index=fork_by_index, fork_and_append=fork_and_append,
                                              replace_branch=replace_branch)
    return _programs[sgl.__name__]


def truth(qa) -> str:
    return qa.answer.strip()


def questions_of(seed: int, qtypes=("colour", "shape", "position")) -> tuple[bytes, list]:
    picture, qas = scene_png(seed)
    return picture, [qa for qa in qas if qa.qtype in qtypes]


def test_gen_with_stop_and_max_tokens(frontend):
    # scene 4's shape question (the built-in model asked scene 3's, "What shape is in the picture?" about a
    # lone orange square, answers "An orange square.": this test is about stop and max_tokens, not that)
    p, picture = frontend.programs, scene_png(4)[0]
    qa = questions_of(4, ("shape",))[1][0]
    full = p.ask.run(picture=picture, question=qa.question, temperature=0, backend=frontend.backend)
    assert full["answer"].strip() == truth(qa)
    stopped = p.ask.run(picture=picture, question=qa.question, stop_at=["."], temperature=0, backend=frontend.backend)
    assert stopped["answer"] == full["answer"][:full["answer"].index(".")]  # the stop string is trimmed
    assert stopped.get_meta_info("answer")["finish_reason"] == {"type": "stop", "matched": "."}
    short = p.ask.run(picture=picture, question=qa.question, limit=2, temperature=0, backend=frontend.backend)
    meta = short.get_meta_info("answer")
    assert meta["completion_tokens"] == 2 and meta["finish_reason"] == {"type": "length", "length": 2}
    assert full["answer"].startswith(short["answer"])


def test_multi_turn_chat_with_an_image(frontend):
    picture, qas = questions_of(5, ("colour", "shape"))
    first, second = qas[0], qas[1]
    state = frontend.programs.chat.run(picture=picture, first=first.question, second=second.question,
                                       temperature=0, backend=frontend.backend)
    assert (state["first"].strip(), state["second"].strip()) == (truth(first), truth(second))
    assert [m["role"] for m in state.messages() if m["role"] != "system"] == ["user", "assistant"] * 2
    text = state.text()
    assert text.count("USER:") == 2 and text.count("ASSISTANT:") == 2 and text.endswith("</s>")


@pytest.mark.parametrize("method", METHODS)
def test_select_over_a_picture(frontend, method):
    for seed in (7, 11):
        picture, qas = questions_of(seed, ("colour",))
        for qa in qas[:2]:
            state = frontend.programs.pick.run(picture=picture, question=qa.question, method=method,
                                               backend=frontend.backend)
            meta = state.get_meta_info("colour")
            assert len(meta["normalized_prompt_logprobs"]) == len(COLOURS)
            if method == "unconditional_likelihood_normalized":
                _assert_unconditional_pick(state["colour"], meta)
            else:
                assert state["colour"].strip() + "." == truth(qa), (seed, qa.question, meta)


def _assert_unconditional_pick(pick: str, meta: dict) -> None:
    """The pick net of each option's logprob alone (SGLang's UnconditionalLikelihoodNormalized): what
    the server must get right is the logprobs it serves — each option's conditional and unconditional
    entries token for token, numbers past the first — and the pick is their best mean difference. Which
    colour wins under this normalisation is the model's calibration, not the client protocol's."""
    cond, uncond = meta["input_token_logprobs"], meta["unconditional_token_logprobs"]
    assert len(cond) == len(uncond) == len(COLOURS)
    for c, u in zip(cond, uncond):
        assert len(c) == len(u) > 0 and all(isinstance(e[0], float) for e in u[1:])
    scores = [sum(a[0] - (b[0] or 0.0) for a, b in zip(c, u)) / len(c) for c, u in zip(cond, uncond)]
    assert scores == pytest.approx(meta["normalized_unconditional_prompt_logprobs"], abs=1e-6)
    assert pick == COLOURS[scores.index(max(scores))]


def test_fork_join_every_way(frontend, monkeypatch):
    p, backend = frontend.programs, frontend.backend
    picture, qas = questions_of(9)
    questions = [qa.question for qa in qas[:3]]
    gathered = p.fork_all.run(picture=picture, questions=questions, temperature=0, backend=backend)
    assert [a.strip() for a in gathered["answer"]] == [truth(qa) for qa in qas[:3]]

    indexed = p.fork_by_index.run(picture=picture, questions=questions, temperature=0, backend=backend)
    assert indexed["answer"] == indexed["in_order"] == gathered["answer"]

    with pytest.raises((AssertionError, ValueError)):  # SGLang's asserts, vlserve.lang's says why
        p.replace_branch.run(backend=backend)

    if frontend.name == "sglang":
        # SGLang's client joins "concate_and_append" through a KV-cache route SGLang's own server no
        # longer has either (/concate_and_append_request); with parallel encoding off it joins by text
        monkeypatch.setattr(frontend.sgl.global_config, "enable_parallel_encoding", False)
    follow_ups = [qa.question for qa in qas[1:3]]
    appended = p.fork_and_append.run(picture=picture, question=qas[0].question, follow_ups=follow_ups,
                                     temperature=0, backend=backend)
    prefix, branches = appended["prefix"], appended["branches"]
    assert appended.text() == prefix + "".join(b[len(prefix):] for b in branches)
    for branch, qa in zip(branches, qas[1:3]):
        assert branch.startswith(prefix) and truth(qa) in branch[len(prefix):]


def test_run_batch(frontend):
    picture, qas = questions_of(13)
    states = frontend.programs.ask.run_batch([{"picture": picture, "question": qa.question} for qa in qas[:4]],
                                             temperature=0, backend=frontend.backend)
    assert [s["answer"].strip() for s in states] == [truth(qa) for qa in qas[:4]]


def test_regex(frontend):
    picture, qas = questions_of(15, ("colour",))
    pattern = r" (Red|Green|Blue|Yellow|Purple|Orange)\."
    for qa in qas[:2]:
        state = frontend.programs.ask.run(picture=picture, question=qa.question, regex=pattern, temperature=0,
                                          backend=frontend.backend)
        assert re.fullmatch(pattern, state["answer"]) and state["answer"].strip() == truth(qa)
    # a regex the model would never follow by itself is still obeyed
    state = frontend.programs.ask.run(picture=picture, question=qas[0].question, regex=r" [0-9]{3}",
                                      temperature=0, backend=frontend.backend)
    assert re.fullmatch(r" [0-9]{3}", state["answer"])


def test_streaming(frontend):
    picture, qas = questions_of(17, ("colour", "shape"))
    kwargs = dict(picture=picture, first=qas[0].question, second=qas[1].question, temperature=0,
                  backend=frontend.backend)
    reference = frontend.programs.chat.run(**kwargs)
    state = frontend.programs.chat.run(stream=True, **kwargs)
    assert "".join(state.text_iter("second")) == reference["second"]
    assert state["second"].strip() == truth(qas[1])
    state = frontend.programs.chat.run(stream=True, **kwargs)
    assert "".join(state.text_iter()) == reference.text()


def test_logprobs(frontend):
    picture, qas = questions_of(19, ("colour",))
    state = frontend.programs.ask.run(picture=picture, question=qas[0].question, logprobs=True, temperature=0,
                                      backend=frontend.backend)
    answer, meta = state["answer"], state.get_meta_info("answer")
    assert answer.strip() == truth(qas[0])
    out = meta["output_token_logprobs"]
    assert len(out) == meta["completion_tokens"] and all(len(e) == 3 and e[0] <= 0 for e in out)
    assert "".join(text for _, _, text in out).startswith(answer)  # each entry's text is its token's
    inputs = meta["input_token_logprobs"]
    assert len(inputs) == meta["prompt_tokens"] and inputs[0][0] is None  # logprob_start_len 0: every position
    assert sum(lp is None for lp, _, _ in inputs) == 1 + sum(t == "<image>" for _, _, t in inputs)
    tops = meta["output_top_logprobs"]
    assert len(tops) == len(out) and all(len(top) == 2 for top in tops)
    for (lp, tid, _), top in zip(out, tops):  # greedy: the chosen token is the likeliest
        assert top[0][1] == tid and top[0][0] == pytest.approx(lp, abs=1e-5) and top[1][0] <= top[0][0]


def test_flush_cache_and_server_info(frontend, served):
    sgl, backend = frontend.sgl, frontend.backend
    picture, qas = questions_of(21, ("shape",))
    state = frontend.programs.ask.run(picture=picture, question=qas[0].question, temperature=0, backend=backend)
    assert state["answer"].strip() == truth(qas[0])  # SGLang's run returns at once: reading the answer waits for it
    assert served[0].wait_idle()  # the answer can arrive before its request leaves the scheduler
    assert served[0].pool_state()["cached"] > 0
    flushed = sgl.flush_cache(backend)
    assert flushed in (None, True)  # SGLang's returns None (it raises on a refusal), vlserve.lang's True
    assert served[0].pool_state()["cached"] == 0
    if frontend.name == "sglang":  # chosen from /get_model_info's model_path: the built-in model's format
        assert backend.get_model_name() == "vlserve-builtin-llava-v1.5"
        assert backend.get_chat_template().name == "vicuna_v1.1"
    info = sgl.get_server_info(backend)
    assert info["max_total_tokens"] == served[0].args.max_total_tokens and "version" in info
    assert info == httpx.get(served[1].url + "/get_server_info", timeout=10).json() | {
        "internal_states": info["internal_states"]}
