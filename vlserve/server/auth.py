"""`--api-key`: every route but /health, /metrics and the page needs `Authorization: Bearer KEY` (else 401).

/health and /metrics stay open so load balancers and Prometheus scrapers need no secret; neither
reveals request content. The page (/ and /static/) is static files; its requests carry the key.
Checked before the body is read, so an unauthenticated upload costs nothing.
"""

import secrets

from vlserve.server.errors import send_json_error

OPEN_PATHS = frozenset({"/health", "/metrics", "/"})  # and the page's files under /static/


class APIKeyMiddleware:
    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or path in OPEN_PATHS or path.startswith("/static/") or self._authorized(scope):
            return await self.app(scope, receive, send)
        await send_json_error(send, 401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                              code="invalid_api_key", headers=[(b"www-authenticate", b"Bearer")])

    def _authorized(self, scope) -> bool:
        got = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        return secrets.compare_digest(got, self.expected)
