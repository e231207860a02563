"""The router's key is the engine's radix key (vlserve/router/keys.py against Engine.tokenize)."""

import json

from helpers.server_helpers import data_uri, image_message, png, shared_server, tiny_model_dir
from vlserve.router.keys import RouteKeys
from vlserve.router.model_files import ModelFiles
from vlserve.server.chat import build_chat_prompt
from vlserve.server.openai_protocol import ChatMessage


def keys() -> RouteKeys:
    return RouteKeys(ModelFiles.read(tiny_model_dir()))


def test_chat_key_is_the_engines_radix_key():
    engine, _ = shared_server()
    uri = data_uri(png(seed=1))
    messages = image_message(uri, "What is in the image?")
    prompt = build_chat_prompt(engine.tokenizer, [ChatMessage.model_validate(m) for m in messages])
    expected = engine.tokenize(prompt=prompt.text, image_data=prompt.images)
    got = keys().key("/v1/chat/completions", json.dumps({"messages": messages}).encode())
    assert got == expected
    assert any(t >= engine.loaded.config.text.vocab_size for t in got)  # the image's pseudo tokens are in it


def test_generate_and_completion_keys():
    engine, _ = shared_server()
    uri = data_uri(png(seed=2))
    k = keys()
    body = {"text": "<image>\nDescribe it.", "image_data": uri, "sampling_params": {"max_new_tokens": 2}}
    assert k.key("/generate", json.dumps(body).encode()) == engine.tokenize(prompt=body["text"], image_data=[uri])
    batch = {"text": ["<image>\nA", "<image>\nB"], "image_data": [uri, uri]}
    assert k.key("/generate", json.dumps(batch).encode()) == engine.tokenize(prompt="<image>\nA", image_data=[uri])
    assert k.key("/v1/completions", b'{"prompt": "Hello there"}') == engine.tokenize(prompt="Hello there")
    assert k.key("/v1/completions", b'{"prompt": [[5, 6, 7], [8]]}') == [5, 6, 7]


def test_same_text_other_image_is_another_key():
    k = keys()
    a, b, a2 = (k.key("/v1/chat/completions", json.dumps({"messages": image_message(data_uri(png(seed=s)))}).encode())
                for s in (3, 4, 3))
    assert a == a2 and len(a) == len(b) and a != b
    first_pad = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert a[:first_pad] == b[:first_pad]  # only the template's text before the image is shared


def test_unkeyable_requests_have_no_key():
    k = keys()
    assert k.key("/v1/chat/completions", b"not json") is None
    body = json.dumps({"messages": image_message("http://example.com/a.png")}).encode()
    assert k.key("/v1/chat/completions", body) is None
    assert k.key("/v1/models", b"") is None
    assert k.key("/generate", b'{"sampling_params": {}}') is None


def test_anyres_key_is_the_engines_radix_key(tmp_path):
    """A LLaVA-NeXT checkpoint: the router keys (and counts) a tiled image as its engine does."""
    from vlserve import Engine
    from vlserve.testing.tiny_anyres import make_tiny_llava_next

    path = make_tiny_llava_next(str(tmp_path / "next"))
    uri = data_uri(png(seed=5))
    body = {"text": "<image>\nDescribe it.", "image_data": uri}
    got = RouteKeys(ModelFiles.read(path)).key("/generate", json.dumps(body).encode())
    with Engine(path, max_total_tokens=1024) as engine:
        expected = engine.tokenize(prompt=body["text"], image_data=[uri])
        assert sum(t >= engine.loaded.config.text.vocab_size for t in expected) > engine.loaded.config.tokens_per_image
    assert got == expected
