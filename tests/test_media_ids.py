"""Media ids (a content part's `uuid`, vLLM's meaning) and each media item processed once (issue 48)."""

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from helpers.server_helpers import data_uri, metric_values, png
from vlserve.core.errors import InvalidRequest
from vlserve.engine.media_ids import MediaIdStore, MediaRef
from vlserve.preprocess import MediaLimits, ProcessedImageCache
from vlserve.preprocess.processing import ImageProcessing
from vlserve.server.args import ServerArgs
from vlserve.server.background import BackgroundServer


def _chat(http, part: dict, text: str = "What is it?", **kwargs) -> httpx.Response:
    return http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": [part, {"type": "text", "text": text}]}],
        "max_tokens": 4, "temperature": 0}, **kwargs)


def test_a_uuid_without_data_answers_as_resending_the_bytes(http):
    image = data_uri(png(seed=61))
    first = _chat(http, {"type": "image_url", "image_url": {"url": image}, "uuid": "pic-61"})
    by_id = _chat(http, {"type": "image_url", "uuid": "pic-61"})
    resent = _chat(http, {"type": "image_url", "image_url": {"url": image}})
    assert first.status_code == by_id.status_code == resent.status_code == 200, by_id.text
    a, b = by_id.json(), resent.json()
    assert a["choices"][0]["message"] == b["choices"][0]["message"]
    assert a["usage"] == b["usage"]
    assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == a["usage"]["prompt_tokens"] - 1


def test_an_unknown_uuid_is_a_400_naming_it(http):
    r = _chat(http, {"type": "video_url", "uuid": "never-sent-7"})
    assert r.status_code == 400 and "never-sent-7" in r.json()["error"]["message"]
    r = _chat(http, {"type": "image_url"})
    assert r.status_code == 400 and "uuid" in r.json()["error"]["message"]


def test_over_http_an_id_is_the_api_keys_own(server):
    """Two keys (vLLM's --api-key K1 K2): a uuid sent under one is a 400 naming it under the other,
    and answers under its own."""
    args = ServerArgs(port=0, api_key=["key-a", "key-b"])
    with BackgroundServer(server[0], args) as guarded, httpx.Client(base_url=guarded.url, timeout=60) as c:
        def chat(part: dict, key: str) -> httpx.Response:
            return _chat(c, part, headers={"Authorization": f"Bearer {key}"})

        sent = chat({"type": "image_url", "image_url": {"url": data_uri(png(seed=64))}, "uuid": "pic-64"}, "key-a")
        assert sent.status_code == 200, sent.text
        other = chat({"type": "image_url", "uuid": "pic-64"}, "key-b")
        assert other.status_code == 400 and "pic-64" in other.json()["error"]["message"], other.text
        own = chat({"type": "image_url", "uuid": "pic-64"}, "key-a")
        assert own.status_code == 200, own.text
        usage = own.json()["usage"]
        assert usage["prompt_tokens"] == sent.json()["usage"]["prompt_tokens"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1


def test_ids_are_scoped_and_the_store_is_an_lru_by_bytes():
    store, limits = MediaIdStore(max_bytes=10), MediaLimits()
    assert store.resolve(MediaRef(b"abcdef", "x"), "image", "key-a", limits) == b"abcdef"
    assert store.resolve(MediaRef(None, "x"), "image", "key-a", limits) == b"abcdef"
    for scope, kind in (("key-b", "image"), ("key-a", "video")):  # another key's, or another kind's
        with pytest.raises(InvalidRequest, match="unknown"):
            store.resolve(MediaRef(None, "x"), kind, scope, limits)
    store.resolve(MediaRef(b"123456", "y"), "image", "key-a", limits)  # 12 bytes > 10: x is evicted
    assert len(store) == 1 and store.num_bytes == 6
    with pytest.raises(InvalidRequest, match="'x'"):
        store.resolve(MediaRef(None, "x"), "image", "key-a", limits)


def test_concurrent_misses_on_one_item_process_it_once():
    calls, gate = [], threading.Event()

    class SlowProcessing(ImageProcessing):
        def process(self, image):
            calls.append(1)
            gate.wait(5)
            return super().process(image)

    cache = ProcessedImageCache(on_process=lambda kind: calls.append(kind))
    processing = SlowProcessing(shortest_edge=16, crop_size=(16, 16))
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(cache.prepare_image, png(seed=62), processing) for _ in range(8)]
        gate.set()
        results = [f.result() for f in futures]
    assert calls == [1, "image"] and all(r is results[0] for r in results)


def test_eight_concurrent_requests_with_one_new_picture_decode_it_and_run_the_tower_once(http):
    before = http.get("/metrics").text
    image = data_uri(png(seed=63, width=48, height=48))
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: _chat(http, {"type": "image_url", "image_url": {"url": image}},
                                                 f"Question {i}?"), range(8)))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    after = http.get("/metrics").text

    def delta(name: str, **labels) -> float:
        def value(text):
            return sum(v for k, v in metric_values(text, name).items()
                       if all(f'{key}="{val}"' in k for key, val in labels.items()))
        return value(after) - value(before)

    assert delta("vlserve_media_decodes_total", kind="image") == 1
    assert delta("vlserve_vision_encoder_images_total") == 1
    assert delta("vlserve_vision_tower_runs_total") == 1
