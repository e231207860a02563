"""`--api-key`: every route but /health, /metrics and the page needs `Authorization: Bearer KEY` (else 401).

/health and /metrics stay open so load balancers and Prometheus scrapers need no secret; neither
reveals request content. The page (/ and /static/) is static files; its requests carry the key.
Checked before the body is read, so an unauthenticated upload costs nothing.
"""

import hashlib
import secrets

from vlserve.server.errors import send_json_error

OPEN_PATHS = frozenset({"/health", "/metrics", "/"})  # and the page's files under /static/
MEDIA_SCOPE = "vlserve_media_scope"  # request.state's name for the scope of the key's media ids


def media_scope(request) -> str:
    """The scope a request's media uuids live in: its API key's, or the server's ("") without one."""
    return getattr(request.state, MEDIA_SCOPE, "")


class APIKeyMiddleware:
    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()
        self.media_scope = hashlib.sha256(self.expected).hexdigest()  # the key's media ids (engine/media_ids.py)

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or path in OPEN_PATHS or path.startswith("/static/"):
            return await self.app(scope, receive, send)
        if self._authorized(scope):
            scope.setdefault("state", {})[MEDIA_SCOPE] = self.media_scope
            return await self.app(scope, receive, send)
        await send_json_error(send, 401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                              code="invalid_api_key", headers=[(b"www-authenticate", b"Bearer")])

    def _authorized(self, scope) -> bool:
        got = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        return secrets.compare_digest(got, self.expected)
