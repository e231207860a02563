"""`--api-key`: every route but /health, /metrics and the page needs `Authorization: Bearer KEY` (else 401).

/health and /metrics stay open so load balancers and Prometheus scrapers need no secret; neither
reveals request content. The page (/ and /static/) is static files; its requests carry the key.
Checked before the body is read, so an unauthenticated upload costs nothing.

Several keys may be given (vLLM's `--api-key K1 K2`); each is a scope of media ids of its own
(engine/media_ids.py): a uuid sent under one key is unknown under another, as the bearer token the
request carried names the scope, a hash of it, never the key itself.
"""

import hashlib
import secrets

from vlserve.server.errors import send_json_error

OPEN_PATHS = frozenset({"/health", "/metrics", "/"})  # and the page's files under /static/
MEDIA_SCOPE = "vlserve_media_scope"  # request.state's name for the scope of the key's media ids


def media_scope(request) -> str:
    """The scope a request's media uuids live in: its API key's, or the server's ("") without one."""
    return getattr(request.state, MEDIA_SCOPE, "")


def api_keys(api_key: str | list[str] | None) -> list[str]:
    """The keys of --api-key (one, or several)."""
    if api_key is None:
        return []
    return [api_key] if isinstance(api_key, str) else [k for k in api_key if k]


class APIKeyMiddleware:
    def __init__(self, app, api_key: str | list[str]):
        self.app = app
        # each accepted header, and the scope of its key's media ids (engine/media_ids.py)
        self.scopes = {f"Bearer {k}".encode(): hashlib.sha256(f"Bearer {k}".encode()).hexdigest()
                       for k in api_keys(api_key)}

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or path in OPEN_PATHS or path.startswith("/static/"):
            return await self.app(scope, receive, send)
        media = self._media_scope(scope)
        if media is not None:
            scope.setdefault("state", {})[MEDIA_SCOPE] = media
            return await self.app(scope, receive, send)
        await send_json_error(send, 401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                              code="invalid_api_key", headers=[(b"www-authenticate", b"Bearer")])

    def _media_scope(self, scope) -> str | None:
        """The media scope of the key the request carries; None when it carries none of the keys (each
        compared in constant time)."""
        got = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        matches = [media for expected, media in self.scopes.items() if secrets.compare_digest(got, expected)]
        return matches[0] if matches else None
