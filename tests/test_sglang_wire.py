"""/generate on SGLang's wire, field by field (the shared test server, a tiny model): every sampling
parameter SGLang's SamplingParams has is accepted at its default, honoured where vlserve can
(stop_regex, no_stop_trim, sampling_seed, stream_interval) and refused by name otherwise; one
image_data string serves a whole batch; logprob entries are [logprob, id, text] from logprob_start_len."""

import json

import pytest

from helpers.server_helpers import data_uri, png

# What SGLang's frontend sends with every gen (RuntimeEndpoint.generate: its global_config's two
# flags, then SglSamplingParams.to_srt_kwargs), plus the rest of SGLang's SamplingParams at their defaults.
SGLANG_DEFAULTS = {
    "skip_special_tokens": True, "spaces_between_special_tokens": True, "max_new_tokens": 4, "min_new_tokens": 0,
    "n": 1, "stop": [], "stop_token_ids": [], "stop_regex": [], "temperature": 0, "top_p": 1.0, "top_k": -1,
    "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "ignore_eos": False, "regex": None,
    "json_schema": None, "ebnf": None, "structural_tag": None, "beam_width": None, "no_stop_trim": False,
    "stream_interval": None, "logit_bias": None, "sampling_seed": None, "custom_params": None, "watermark": None,
    "repetition_penalty": 1.0,
}


def generate(http, **body):
    return http.post("/generate", json={"text": "Hello", **body})


def test_sglang_defaults_are_accepted(http):
    plain = generate(http, sampling_params={"max_new_tokens": 4, "temperature": 0})
    full = generate(http, sampling_params=SGLANG_DEFAULTS)
    assert full.status_code == 200, full.text
    assert full.json()["output_ids"] == plain.json()["output_ids"]


@pytest.mark.parametrize("name, value", [("n", 2), ("ebnf", "root ::= \"a\""), ("beam_width", 2),
                                         ("structural_tag", "{}"), ("custom_params", {"k": 1}),
                                         ("watermark", {"key": 1})])
def test_values_vlserve_cannot_honour_are_refused_by_name(http, name, value):
    response = generate(http, sampling_params={**SGLANG_DEFAULTS, name: value})
    assert response.status_code == 400 and name in response.json()["error"]["message"]


def test_unknown_names_are_still_refused(http):
    response = generate(http, sampling_params={"temprature": 0})
    assert response.status_code == 400 and "temprature" in response.json()["error"]["message"]
    bad_regex = generate(http, sampling_params={"stop_regex": "("})
    assert bad_regex.status_code == 400 and "stop_regex" in bad_regex.json()["error"]["message"]
    refused = generate(http, lora_path="adapter")
    assert refused.status_code == 400 and "lora_path" in refused.json()["error"]["message"]


def test_stop_regex_and_no_stop_trim(http):
    forced = {"max_new_tokens": 8, "temperature": 0, "regex": "ab[0-9][a-z]+"}
    whole = generate(http, sampling_params=forced).json()
    assert whole["text"][:2] == "ab" and whole["text"][2].isdigit() and len(whole["text"]) > 3
    stopped = generate(http, sampling_params={**forced, "stop_regex": "[0-9]"}).json()
    assert stopped["text"] == "ab" and stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": "[0-9]"}
    kept = generate(http, sampling_params={**forced, "stop_regex": ["[0-9]"], "no_stop_trim": True}).json()
    assert kept["text"] == whole["text"][:3]
    kept = generate(http, sampling_params={**forced, "stop": whole["text"][2], "no_stop_trim": True}).json()
    assert kept["text"] == whole["text"][:3] and kept["meta_info"]["finish_reason"]["matched"] == whole["text"][2]


def test_sampling_seed_is_seed(http):
    params = {"max_new_tokens": 6, "temperature": 1.0, "ignore_eos": True}
    a = generate(http, sampling_params={**params, "sampling_seed": 7}).json()
    b = generate(http, sampling_params={**params, "seed": 7}).json()
    assert a["output_ids"] == b["output_ids"]
    assert generate(http, sampling_params={**params, "seed": 1, "sampling_seed": 2}).status_code == 400


def test_one_image_data_string_serves_the_whole_batch(http):
    image = data_uri(png(seed=3))
    texts = ["USER: <image>\nWhat is it? ASSISTANT:", "USER: <image>\nWhere is it? ASSISTANT:"]
    batch = http.post("/generate", json={"text": texts, "image_data": image,
                                         "sampling_params": {"max_new_tokens": 3, "temperature": 0}}).json()
    for text, answer in zip(texts, batch):
        alone = http.post("/generate", json={"text": text, "image_data": image,
                                             "sampling_params": {"max_new_tokens": 3, "temperature": 0}}).json()
        assert answer["output_ids"] == alone["output_ids"]
        assert answer["meta_info"]["prompt_tokens"] == alone["meta_info"]["prompt_tokens"]
    ids = http.post("/tokenize", json={"prompt": texts[0], "image_data": image}).json()["tokens"]
    # a batch of input_ids: the string goes to the prompts holding the image token (SGLang's select sends so)
    plain = http.post("/tokenize", json={"prompt": "a b c"}).json()["tokens"]
    mixed = http.post("/generate", json={"input_ids": [plain, plain], "image_data": image,
                                         "sampling_params": {"max_new_tokens": 0}})
    assert mixed.status_code == 200 and all(r["meta_info"]["prompt_tokens"] == len(plain) for r in mixed.json())
    assert len(ids) == batch[0]["meta_info"]["prompt_tokens"]  # the image's tokens are in both prompts


def test_logprob_entries_from_logprob_start_len(http, server):
    tokenizer = server[0].tokenizer
    ids = [1, 50, 60, 70, 80, 90]
    out = http.post("/generate", json={"input_ids": ids, "return_logprob": True, "logprob_start_len": 2,
                                       "top_logprobs_num": 2, "return_text_in_logprobs": True,
                                       "sampling_params": {"max_new_tokens": 3, "temperature": 0}}).json()
    meta = out["meta_info"]
    inputs = meta["input_token_logprobs"]
    assert len(inputs) + 2 == meta["prompt_tokens"] and [e[1] for e in inputs] == ids[2:]
    assert all(e[0] < 0 and e[2] == tokenizer.decode([e[1]]) for e in inputs)
    outputs = meta["output_token_logprobs"]
    assert [e[1] for e in outputs] == out["output_ids"] and [e[2] for e in outputs] == [
        tokenizer.decode([t]) for t in out["output_ids"]]
    assert all(len(top) == 2 and all(len(e) == 3 and isinstance(e[2], str) for e in top)
               for top in meta["output_top_logprobs"])
    input_tops = meta["input_top_logprobs"]  # per prompt position: its two likeliest tokens, best first
    assert len(input_tops) == len(inputs)
    for (lp, _, _), top in zip(inputs, input_tops):
        assert len(top) == 2 and top[0][0] >= top[1][0] and top[0][0] >= lp - 1e-5
        assert all(e[2] == tokenizer.decode([e[1]]) for e in top)
    # from position 0, whose token has no logprob; without text, the third entry is null
    zero = http.post("/generate", json={"input_ids": ids, "return_logprob": True, "logprob_start_len": 0,
                                        "top_logprobs_num": 1, "sampling_params": {"max_new_tokens": 1}}).json()
    zero = zero["meta_info"]
    assert zero["input_token_logprobs"][0] == [None, 1, None] and zero["input_token_logprobs"][2:] == [
        [e[0], e[1], None] for e in inputs]
    assert zero["input_top_logprobs"][0] is None and [t[0][:2] for t in zero["input_top_logprobs"][2:]] == [
        t[0][:2] for t in input_tops]
    # no start: output logprobs only (SGLang's -1) ...
    unset = http.post("/generate", json={"input_ids": ids, "return_logprob": True,
                                         "sampling_params": {"max_new_tokens": 1}}).json()["meta_info"]
    assert unset["input_token_logprobs"] == [] and len(unset["output_token_logprobs"]) == 1
    # ... but a prefill-only request, which has no output, gets its whole prompt's
    prefill = http.post("/generate", json={"input_ids": ids, "return_logprob": True,
                                           "sampling_params": {"max_new_tokens": 0}}).json()["meta_info"]
    assert prefill["input_token_logprobs"] == zero["input_token_logprobs"] and "input_top_logprobs" not in prefill


def test_stream_interval(http):
    body = {"text": "Hello", "stream": True,
            "sampling_params": {"max_new_tokens": 7, "temperature": 0, "ignore_eos": True, "stream_interval": 3}}
    with http.stream("POST", "/generate", json=body) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    counts = [len(json.loads(line[6:])["output_ids"]) for line in lines]
    assert counts == [3, 6, 7]
    assert generate(http, sampling_params={"stream_interval": 0}).status_code == 400
