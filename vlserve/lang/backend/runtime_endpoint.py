"""A vlserve server as a backend, over its native /generate route."""

import json

import httpx

from vlserve.lang.backend.native import NativeBackend
from vlserve.lang.chat_template import VICUNA


class RuntimeEndpoint(NativeBackend):
    def __init__(self, base_url: str, api_key: str | None = None, chat_template=VICUNA, timeout: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self.chat_template = chat_template
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout,
                                   limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    def media_value(self, item) -> str:
        return item.data_uri()

    def call(self, payload: dict):
        response = self.client.post("/generate", json=payload)
        if response.status_code != 200:
            raise RuntimeError(f"{self.base_url}/generate answered {response.status_code}: {_message(response)}")
        return response.json()

    def call_stream(self, payload: dict):
        with self.client.stream("POST", "/generate", json={**payload, "stream": True}) as response:
            if response.status_code != 200:
                response.read()
                raise RuntimeError(f"{self.base_url}/generate answered {response.status_code}: {_message(response)}")
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    raise RuntimeError(f"{self.base_url}/generate: {chunk['error']}")
                yield chunk

    def flush_cache(self) -> bool:
        """True once flushed; False while requests run (the server flushes only when idle)."""
        response = self.client.post("/flush_cache")
        if response.status_code not in (200, 400):
            raise RuntimeError(f"{self.base_url}/flush_cache answered {response.status_code}: {_message(response)}")
        return response.status_code == 200

    def get_server_info(self) -> dict:
        response = self.client.get("/server_info")
        if response.status_code != 200:
            raise RuntimeError(f"{self.base_url}/server_info answered {response.status_code}: {_message(response)}")
        return response.json()

    def shutdown(self) -> None:
        self.client.close()


def _message(response: httpx.Response) -> str:
    try:
        return response.json()["error"]["message"]
    except Exception:
        return response.text[:500]
