"""A real server with --allow-url-fetch: an image URL naming the server itself (or any loopback or
private address) is refused with a 400 that echoes nothing it fetched; a host the operator allows by
name is fetched."""

import io
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest
from PIL import Image

from helpers.server_helpers import start_server


def _png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((16, 16, 3), 200, dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


class _Files(BaseHTTPRequestHandler):
    def do_GET(self):
        body = _png() if self.path == "/cat.png" else b"internal: do not leak"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def media_host():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _ask(url: str, image: str) -> httpx.Response:
    return httpx.post(url + "/generate", json={"text": "<image>\nWhat?", "image_data": image,
                                               "sampling_params": {"max_new_tokens": 1}}, timeout=60)


def test_fetching_is_public_only_unless_the_host_is_allowed(media_host):
    engine, srv = start_server(allow_url_fetch=True)
    try:
        for target in (srv.url + "/health", f"http://{media_host}/cat.png", f"http://{media_host}/secret"):
            r = _ask(srv.url, target)
            assert r.status_code == 400 and "non-public address" in r.json()["error"]["message"], r.text
            assert "do not leak" not in r.text and '"status"' not in r.text
    finally:
        srv.stop()
        engine.shutdown()
    engine, srv = start_server(allow_url_fetch=True, allowed_media_domains="127.0.0.1")
    try:
        assert _ask(srv.url, f"http://{media_host}/cat.png").status_code == 200
        leak = _ask(srv.url, f"http://{media_host}/secret")
        assert leak.status_code == 400 and "do not leak" not in leak.text
        engine.wait_idle()
        engine.scheduler.cm.check_idle_accounting()
    finally:
        srv.stop()
        engine.shutdown()
