"""Drop-in for SGLang and vLLM users: their flag names, `python -m vlserve`, SGLang's service routes,
and the OpenAI routes honouring or refusing every documented field (never silently dropping one)."""

import subprocess
import sys

import pytest

from helpers.server_helpers import data_uri, png, served_model, start_server
from vlserve.cli import parse_serve_args

CHAT = {"model": served_model(), "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def own_server():
    """A server of this module's own: /flush_cache empties its cache."""
    engine, srv = start_server()
    import httpx
    with httpx.Client(base_url=srv.url, timeout=60) as http:
        yield engine, http
    srv.stop()
    engine.shutdown()


def test_sglang_and_vllm_flag_names():
    args = parse_serve_args(["--model-path", "/ckpt", "--tensor-parallel-size", "1", "--served-model-name", "llava",
                             "--mem-fraction-static", "0.2", "--max-queued-requests", "5", "--enable-metrics",
                             "--chat-template", "t.jinja", "--tp-size", "1"])
    assert (args.model, args.tp_size, args.served_model_name, args.mem_fraction_static, args.max_waiting_requests,
            args.chat_template, args.model_name()) == ("/ckpt", 1, "llava", 0.2, 5, "t.jinja", "llava")
    assert parse_serve_args(["--model", "/a/b/"]).model_name() == "b"


@pytest.mark.parametrize("argv,message", [
    (["serve", "--tp", "3", "--nnodes", "2"], "--tp-size 3 must be >= 1 and a multiple of --nnodes 2"),
    (["serve", "--mem-fraction-static", "1.5"], "--mem-fraction-static must be in (0, 1)"),
    (["serve", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["serve", "--schedule-policy", "sjf"], "invalid choice: 'sjf'"),
])
def test_bad_flags_are_usage_errors_of_serve(argv, message):
    run = subprocess.run([sys.executable, "-m", "vlserve", *argv], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and message in run.stderr and "usage: vlserve serve" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_flush_cache_empties_the_cache_and_refuses_while_busy(own_server):
    engine, http = own_server
    body = {"text": "USER: the same words, twice over ASSISTANT:", "sampling_params": {"max_new_tokens": 2}}
    http.post("/generate", json=body)
    assert http.post("/generate", json=body).json()["meta_info"]["cached_tokens"] > 0
    assert http.post("/flush_cache").status_code == 200
    assert http.post("/generate", json=body).json()["meta_info"]["cached_tokens"] == 0
    assert engine.pool_state()["cached"] > 0 and http.get("/flush_cache").status_code == 200
    assert engine.pool_state()["cached"] == 0
    long = engine.make_request(prompt="USER: go on ASSISTANT:",
                               sampling_params={"max_new_tokens": 1500, "ignore_eos": True})
    import threading
    finished = threading.Event()
    long.sink = lambda out: finished.set() if out.finished else None
    engine.submit([long])
    busy = http.post("/flush_cache")
    engine.abort(long.rid)
    assert finished.wait(60)
    assert busy.status_code == 400 and "waiting or running" in busy.json()["error"]["message"]
    engine.wait_idle()
    engine.scheduler.cm.check_idle_accounting()


def test_model_and_server_info(own_server):
    engine, http = own_server
    model = http.get("/get_model_info").json()
    assert model["is_generation"] is True and model["model_path"] == model["tokenizer_path"] == engine.loaded.path
    assert model["architectures"] == ["LlavaForConditionalGeneration"] and model["served_model_name"] == served_model()
    assert http.get("/model_info").json() == model
    info = http.get("/get_server_info").json()
    assert set(http.get("/server_info").json()) == set(info)
    assert info["page_size"] == 1 and info["max_total_tokens"] == 4096 and "api_key" not in info
    assert info["internal_states"][0]["kv_pool_capacity_tokens"] == 4096 and "version" in info


def test_tokenize_shows_the_radix_key_and_detokenize_inverts_it(own_server):
    engine, http = own_server
    text, image = "USER: <image>\nWhat is it? ASSISTANT:", data_uri(png(seed=4))
    tok = http.post("/tokenize", json={"prompt": text, "image_data": image}).json()
    gen = http.post("/generate", json={"text": text, "image_data": image, "sampling_params": {"max_new_tokens": 1}})
    assert tok["count"] == len(tok["tokens"]) == gen.json()["meta_info"]["prompt_tokens"]
    vocab_size = engine.loaded.config.text.vocab_size
    assert sum(t >= vocab_size for t in tok["tokens"]) == engine.loaded.config.tokens_per_image
    assert tok["max_model_len"] == engine.context_len
    other = http.post("/tokenize", json={"prompt": text, "image_data": data_uri(png(seed=5))}).json()
    assert other["tokens"] != tok["tokens"]  # a different picture, different keys
    back = http.post("/detokenize", json={"tokens": tok["tokens"]}).json()["text"]
    assert back.count("<image>") == 1 and "What is it?" in back
    plain = http.post("/tokenize", json={"prompt": ["Hello", "Hello there"], "add_special_tokens": False}).json()
    assert plain["count"][1] > plain["count"][0] and plain["tokens"][0][0] != engine.tokenizer.bos_token_id
    assert http.post("/detokenize", json={"tokens": [-1]}).status_code == 400


@pytest.mark.parametrize("field,value", [("tools", [{"type": "function", "function": {"name": "f"}}]),
                                         ("tool_choice", "auto"), ("suffix", "!"), ("no_such_field", 1)])
def test_openai_fields_not_implemented_are_refused_by_name(http, field, value):
    r = http.post("/v1/chat/completions", json=CHAT | {field: value})
    assert r.status_code == 400 and field in r.json()["error"]["message"], r.text


def test_openai_neutral_values_of_unimplemented_fields_are_accepted(http):
    r = http.post("/v1/chat/completions", json=CHAT | {"parallel_tool_calls": None, "tool_choice": "none",
                                                       "tools": None,
                                                       "user": "u-1"})
    assert r.status_code == 200, r.text
    r = http.post("/v1/completions", json={"model": served_model(), "prompt": "a", "best_of": 3, "max_tokens": 1})
    assert r.status_code == 400 and "best_of" in r.json()["error"]["message"]


def test_openai_extra_sampling_fields_are_honoured(http):
    r = http.post("/v1/chat/completions", json=CHAT | {"regex": "(yes|no)", "max_tokens": 8})
    assert r.json()["choices"][0]["message"]["content"] in ("yes", "no")
    r = http.post("/v1/completions", json={"model": served_model(), "prompt": "Answer:", "max_tokens": 5,
                                           "temperature": 0,
                                           "ignore_eos": True, "min_p": 0.1, "top_k": 1})
    assert r.json()["usage"]["completion_tokens"] == 5
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    r = http.post("/v1/completions", json={"model": served_model(), "prompt": "JSON:", "max_tokens": 16,
                                           "response_format": {"type": "json_schema",
                                                               "json_schema": {"schema": schema}}})
    assert r.json()["choices"][0]["text"] in ('{"ok": true}', '{"ok": false}')


def test_openai_unknown_model_is_404(http):
    r = http.post("/v1/chat/completions", json=CHAT | {"model": "gpt-4o"})
    assert r.status_code == 404 and "gpt-4o" in r.json()["error"]["message"]


def test_python_dash_m_vlserve():
    run = subprocess.run([sys.executable, "-m", "vlserve", "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "serve" in run.stdout


def test_chat_logprobs_and_top_logprobs(http):
    out = http.post("/v1/chat/completions", json=CHAT | {"logprobs": True, "top_logprobs": 3, "max_tokens": 5}).json()
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"] == 5
    for entry in content:
        alts = [a["logprob"] for a in entry["top_logprobs"]]
        assert len(alts) == 3 and alts == sorted(alts, reverse=True) and sum(2.718281828 ** a for a in alts) <= 1.0001
        assert abs(alts[0] - entry["logprob"]) < 1e-5  # greedy: the chosen token is the likeliest
        assert entry["bytes"] == list(entry["token"].encode())
    assert "".join(e["token"] for e in content) == out["choices"][0]["message"]["content"]
    plain = http.post("/v1/chat/completions", json=CHAT).json()
    assert plain["choices"][0]["logprobs"] is None


def test_completion_logprobs_with_echo(http):
    prompt = "Once upon a time"
    out = http.post("/v1/completions", json={"model": served_model(), "prompt": prompt, "max_tokens": 4,
                                             "temperature": 0, "logprobs": 2, "echo": True}).json()
    choice = out["choices"][0]
    assert choice["text"].startswith(prompt)
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4
    assert lp["text_offset"][0] == len(prompt) and all(len(t) == 2 for t in lp["top_logprobs"])
    assert prompt + "".join(lp["tokens"]) == choice["text"]


def test_min_tokens_holds_back_a_stop_token_and_penalties_are_accepted(http):
    base = {"model": served_model(), "prompt": "Once upon a time", "temperature": 0, "max_tokens": 6}
    stop_id = http.post("/generate", json={"text": base["prompt"], "sampling_params": {
        "max_new_tokens": 1, "temperature": 0}}).json()["output_ids"][0]  # the greedy first token
    early = http.post("/v1/completions", json=base | {"stop_token_ids": [stop_id]}).json()
    held = http.post("/v1/completions", json=base | {"stop_token_ids": [stop_id], "min_tokens": 3}).json()
    assert early["usage"]["completion_tokens"] == 1 and early["choices"][0]["finish_reason"] == "stop"
    assert held["usage"]["completion_tokens"] >= 3
    penalised = http.post("/v1/completions", json=base | {"presence_penalty": 1.5, "frequency_penalty": 0.5,
                                                           "repetition_penalty": 1.3})
    assert penalised.status_code == 200, penalised.text


def test_logit_bias_forces_a_token(http):
    body = {"model": served_model(), "prompt": "Once upon a time", "max_tokens": 3, "temperature": 0,
            "logprobs": 0}

    def ids(r: dict) -> list[int]:
        return http.post("/tokenize", json={"prompt": r["choices"][0]["text"],
                                            "add_special_tokens": False}).json()["tokens"]

    forced = http.post("/v1/completions", json=body | {"logit_bias": {"40": 100}}).json()
    assert ids(forced) == [40, 40, 40]
    assert http.post("/v1/completions", json=body | {"logit_bias": {"x": 1}}).status_code == 400


def test_generate_answers_in_sglang_shapes_field_by_field(http):
    out = http.post("/generate", json={"text": "Hello", "rid": "my-request", "return_logprob": True,
                                       "top_logprobs_num": 2, "sampling_params": {"max_new_tokens": 3,
                                                                                  "temperature": 0}}).json()
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert meta["id"] == "my-request" and meta["finish_reason"] == {"type": "length", "length": 3}
    assert meta["prompt_tokens"] > 0 and meta["completion_tokens"] == 3 and meta["cached_tokens"] >= 0
    assert meta["e2e_latency"] > 0
    assert [i for _, i, text in meta["output_token_logprobs"] if text is None] == out["output_ids"]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])
    stop = http.post("/generate", json={"text": "Hello", "sampling_params": {
        "max_new_tokens": 3, "temperature": 0, "stop_token_ids": out["output_ids"][:1]}}).json()
    assert stop["meta_info"]["finish_reason"] == {"type": "stop", "matched": out["output_ids"][0]}


def test_continue_final_message_continues_the_assistant_turn(http):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well, the"}]
    body = CHAT | {"messages": messages, "continue_final_message": True, "add_generation_prompt": False,
                   "max_tokens": 3}
    cont = http.post("/v1/chat/completions", json=body).json()
    prompt_len = cont["usage"]["prompt_tokens"]
    closed = http.post("/v1/chat/completions", json=CHAT | {"messages": messages, "max_tokens": 3}).json()
    assert prompt_len < closed["usage"]["prompt_tokens"]  # no end-of-turn and no new ASSISTANT: prefix
    bad = http.post("/v1/chat/completions",
                    json=CHAT | {"continue_final_message": True, "add_generation_prompt": False})
    assert bad.status_code == 400 and "assistant message last" in bad.json()["error"]["message"]


def test_several_served_names_and_the_openai_client_parses_logprobs():
    import openai

    engine, srv = start_server(served_model_name="llava,llava-1.5")
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["llava", "llava-1.5"]
        chat = client.chat.completions.create(model="llava-1.5", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=3, temperature=0, logprobs=True, top_logprobs=2, n=2)
        assert chat.model == "llava" and len(chat.choices) == 2
        assert all(len(c.logprobs.content) == 3 and len(c.logprobs.content[0].top_logprobs) == 2 for c in chat.choices)
        assert chat.usage.prompt_tokens_details.cached_tokens >= 0
        done = client.completions.create(model="llava", prompt="Hello", max_tokens=2, logprobs=1, temperature=0)
        assert len(done.choices[0].logprobs.tokens) == 2 and len(done.choices[0].logprobs.top_logprobs[0]) == 1
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="other", prompt="Hello", max_tokens=1)
    finally:
        srv.stop()
        engine.shutdown()
