"""The Ray Serve application's HTTP entry: computes each request's radix key (vlserve/router/keys.py,
from the model's tokenizer and image processor config, no weights) and passes the request, with the
key, to the engine deployment by handle; Ray's request router (request_router.py) picks the replica."""

import asyncio

from starlette.requests import Request
from starlette.responses import StreamingResponse

from vlserve.cluster.asgi_call import HTTPCall
from vlserve.router.keys import RouteKeys
from vlserve.router.model_files import ModelFiles
from vlserve.router.proxy import HOP_BY_HOP


class Ingress:
    def __init__(self, engines, model_path: str, chat_template: str | None = None):
        self.engines = engines  # a DeploymentHandle to EngineReplica
        self.keys = RouteKeys(ModelFiles.read(model_path, chat_template))

    async def __call__(self, request: Request) -> StreamingResponse:
        body = await request.body()
        path = request.url.path
        key = await asyncio.get_running_loop().run_in_executor(None, self.keys.key, path, body)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        call = HTTPCall(request.method, path, request.url.query, headers, body)
        answer = self.engines.options(stream=True).handle.remote(call, route_key=key)
        head = await answer.__anext__()
        return StreamingResponse(_rest(answer), status_code=head["status"],
                                 headers={k: v for k, v in head["headers"] if k.lower() not in HOP_BY_HOP})


async def _rest(answer):
    async for chunk in answer:
        yield chunk
