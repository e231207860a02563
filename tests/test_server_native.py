"""The native routes: /generate (plain, streaming, batch, input_ids, logprobs) and /upload (multipart)."""

import json

import httpx

from helpers.server_helpers import data_uri, jpeg, mp4, png


def sse_payloads(response: httpx.Response) -> list:
    lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_generate_matches_the_offline_engine(server, http):
    engine = server[0]
    body = {"text": "USER: <image>\nWhat is it? ASSISTANT:", "image_data": data_uri(png(seed=9)),
            "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    out = http.post("/generate", json=body).json()
    offline = engine.generate(prompt=body["text"], image_data=[png(seed=9)], sampling_params=body["sampling_params"])
    assert out["text"] == offline["text"] and out["output_ids"] == offline["output_ids"]
    meta = out["meta_info"]
    assert meta["prompt_tokens"] >= 16 and meta["completion_tokens"] == len(out["output_ids"])
    assert meta["finish_reason"]["type"] in ("stop", "length") and meta["cached_tokens"] >= 0


def test_generate_stream_sends_cumulative_chunks(http):
    body = {"text": "Hello there", "sampling_params": {"max_new_tokens": 5, "temperature": 0}}
    plain = http.post("/generate", json=body).json()
    with http.stream("POST", "/generate", json=body | {"stream": True}) as r:
        chunks = sse_payloads(r)
    assert chunks[-1]["text"] == plain["text"] and chunks[-1]["output_ids"] == plain["output_ids"]
    assert all(b["text"].startswith(a["text"]) for a, b in zip(chunks, chunks[1:]))
    assert chunks[-1]["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"]


def test_generate_input_ids_batch_and_logprobs(http):
    one = http.post("/generate", json={"input_ids": [1, 50, 60, 70], "return_logprob": True,
                                       "sampling_params": {"max_new_tokens": 3, "temperature": 0}}).json()
    logprobs = one["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in logprobs] == one["output_ids"] and all(lp <= 0 for lp, _, _ in logprobs)
    batch = http.post("/generate", json={"text": ["Hello", "The quick brown"],
                                         "sampling_params": [{"max_new_tokens": 2, "temperature": 0},
                                                             {"max_new_tokens": 3, "temperature": 0}]}).json()
    assert isinstance(batch, list) and len(batch) == 2
    assert all(1 <= b["meta_info"]["completion_tokens"] <= n for b, n in zip(batch, (2, 3)))
    alone = http.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 2,
                                                                             "temperature": 0}}).json()
    assert batch[0]["output_ids"] == alone["output_ids"]


def test_generate_video(http):
    out = http.post("/generate", json={"text": "<video>\nWhat happens?", "video_data": data_uri(mp4(4), "video/mp4"),
                                       "sampling_params": {"max_new_tokens": 2}}).json()
    assert out["meta_info"]["prompt_tokens"] >= 4 * 16
    by_fps = http.post("/generate", json={"text": "What happens?", "video_data": [data_uri(mp4(6), "video/mp4")],
                                          "video_fps": 3, "sampling_params": {"max_new_tokens": 1}}).json()
    assert by_fps["meta_info"]["prompt_tokens"] >= 3 * 16  # 1 s of video at 3 fps


def test_upload_like_curl(server, http):
    files = {"image": ("cat.jpg", jpeg(seed=3), "image/jpeg")}
    out = http.post("/upload", files=files, data={"prompt": "What is this?", "max_new_tokens": "4",
                                                  "temperature": "0"})
    assert out.status_code == 200, out.text
    out = out.json()
    assert set(out) == {"text", "output_ids", "meta_info"} and out["meta_info"]["prompt_tokens"] > 16
    # chat=true (the default) is the checkpoint's template around one image and the prompt
    engine = server[0]
    templated = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}],
        add_generation_prompt=True, tokenize=False)
    via_generate = http.post("/generate", json={"text": templated, "image_data": data_uri(jpeg(seed=3), "image/jpeg"),
                                                "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).json()
    assert via_generate["output_ids"] == out["output_ids"]
    assert via_generate["meta_info"]["cached_tokens"] >= 16  # same pixels: the upload's KV is reused


def test_upload_raw_prompt_several_images_stop_and_stream(http):
    files = [("image", ("a.png", png(seed=1), "image/png")), ("image", ("b.png", png(seed=2), "image/png"))]
    out = http.post("/upload", files=files, data={"prompt": "<image> and <image>: same?", "chat": "false",
                                                  "max_new_tokens": "3", "stop": ["zzz", "qqq"]}).json()
    assert out["meta_info"]["prompt_tokens"] >= 32
    with http.stream("POST", "/upload", files=files, data={"prompt": "Compare", "stream": "true",
                                                           "max_new_tokens": "3"}) as r:
        assert r.status_code == 200
        chunks = sse_payloads(r)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] in ("stop", "length")


def test_upload_video(http):
    out = http.post("/upload", files={"video": ("clip.mp4", mp4(5), "video/mp4")},
                    data={"prompt": "What moves?", "num_frames": "3", "max_new_tokens": "2"})
    assert out.status_code == 200, out.text
    assert out.json()["meta_info"]["prompt_tokens"] >= 3 * 16


def test_constrained_generate_and_upload(server, http):
    out = http.post("/generate", json={"text": "Is it red?", "sampling_params": {"regex": "(yes|no)",
                                                                               "max_new_tokens": 8}}).json()
    assert out["text"] in ("yes", "no") and out["meta_info"]["finish_reason"]["type"] == "stop"
    up = http.post("/upload", files={"image": ("a.png", png(seed=4), "image/png")},
                   data={"prompt": "Is it red?", "regex": "(yes|no)", "max_new_tokens": "8"}).json()
    assert up["text"] in ("yes", "no")
    bad = http.post("/generate", json={"text": "a", "sampling_params": {"regex": "(yes|no"}})
    assert bad.status_code == 400 and "regex" in bad.json()["error"]["message"]
