"""`vlserve router`: build the worker pool and the key maker, then serve the router with uvicorn.

The key needs the model's tokenizer, chat template and image processor config, not its weights.
They come from a local directory: --model-path, else the path the first worker that answers reports
at /get_model_info (with its chat template and frames per video from /get_server_info), which is
right whenever the router and the workers share a filesystem (`vlserve serve --dp-size N`, one
machine, or a shared model store). Computing the key here, not by asking a worker's /tokenize, costs
no round trip and does not send every image twice over the network.
"""

import logging
import time

import httpx
import uvicorn

from vlserve.model.hub import resolve_model_path
from vlserve.preprocess import DEFAULT_NUM_FRAMES, MediaLimits
from vlserve.router.args import RouterArgs
from vlserve.router.keys import RouteKeys
from vlserve.server.auth import api_keys
from vlserve.router.model_files import ModelFiles
from vlserve.router.policy import PolicyConfig
from vlserve.router.proxy import build_router_app
from vlserve.router.workers import WorkerPool

log = logging.getLogger(__name__)


def make_pool(args: RouterArgs) -> WorkerPool:
    return WorkerPool(list(args.worker_urls), PolicyConfig(args.cache_threshold, args.balance_abs_threshold,
                                                           args.balance_rel_threshold),
                      args.max_tree_size, args.health_check_interval_secs)


def make_keys(args: RouterArgs, wait_s: float = 120.0) -> RouteKeys:
    settings = {"model_path": args.model_path, "chat_template": args.chat_template, "video_frames": None}
    if args.model_path is None:
        settings = ask_workers(args.worker_urls, args.api_key, wait_s)
    path = resolve_model_path(settings["model_path"], args.revision, weights=False)
    files = ModelFiles.read(path, args.chat_template or settings["chat_template"])
    log.info("routing keys from %s (tokenizer, chat template, image processor; no weights)", files.path)
    return RouteKeys(files, MediaLimits(allow_url_fetch=args.allow_url_fetch),
                     settings["video_frames"] or DEFAULT_NUM_FRAMES)


def ask_workers(urls: list[str], api_key: str | list[str] | None, wait_s: float) -> dict:
    """The model path, chat template and frames per video of the first worker that answers."""
    keys = api_keys(api_key)
    headers = {"Authorization": f"Bearer {keys[0]}"} if keys else {}
    end = time.monotonic() + wait_s
    while True:
        for url in urls:
            try:
                info = httpx.get(url.rstrip("/") + "/get_model_info", headers=headers, timeout=5).json()
                server = httpx.get(url.rstrip("/") + "/get_server_info", headers=headers, timeout=5).json()
                return {"model_path": info.get("tokenizer_path") or info["model_path"],
                        "chat_template": server.get("chat_template"), "video_frames": server.get("video_frames")}
            except (httpx.HTTPError, ValueError, KeyError):
                continue
        if time.monotonic() > end:
            raise SystemExit(f"no worker answered /get_model_info within {wait_s:g} s ({', '.join(urls)}); "
                             "start them first or give --model-path")
        time.sleep(0.5)


class RouterServer(uvicorn.Server):
    """SIGTERM/SIGINT stop the router and return from run() (uvicorn's own handler would raise the
    signal again afterwards, killing the process before `--dp-size` stops its engines); a second
    signal exits at once."""

    def handle_exit(self, sig, frame) -> None:
        self.force_exit = self.should_exit
        self.should_exit = True


def run_router(args: RouterArgs) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = build_router_app(make_pool(args), make_keys(args), args.api_key)
    log.info("routing to %s on http://%s:%d", ", ".join(args.worker_urls), args.host, args.port)
    RouterServer(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level.lower())).run()
    return 0
