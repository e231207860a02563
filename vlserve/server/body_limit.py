"""`--max-request-bytes`: a body over the limit gets 413, whether it declares its length or is chunked."""

from starlette.exceptions import HTTPException

from vlserve.server.errors import send_json_error


class BodyTooLarge(HTTPException):
    """An HTTPException, so FastAPI's body parsing re-raises it instead of turning it into a 400."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body is over the limit max_request_bytes={limit}")


class BodyLimitMiddleware:
    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and not declared.isdigit():
            return await send_json_error(send, 400, "Content-Length is not a number", "invalid_content_length")
        if declared is not None and int(declared) > self.max_bytes:
            return await send_json_error(send, 413, f"request body of {int(declared)} bytes is over the limit "
                                                    f"max_request_bytes={self.max_bytes}", "request_too_large")
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counting_receive, send)
