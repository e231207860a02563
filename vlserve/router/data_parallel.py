"""`vlserve serve --dp-size N`: N engine processes behind one HTTP front, in one command.

Each engine is a `vlserve serve` child process on 127.0.0.1 and a free port (the same flags, less the
front's host, port, API key and --dp-size); the router (proxy.py) serves on --host/--port in this
process. Stopping: when the front stops (SIGTERM/SIGINT, or a child failing to start) every child gets
SIGTERM (its own graceful drain, --shutdown-timeout), then SIGKILL if it has not exited. Children
also get SIGKILL from the kernel if this process dies without cleaning up (PR_SET_PDEATHSIG), so no
engine outlives its front.
"""

import ctypes
import dataclasses
import logging
import signal
import socket
import subprocess
import sys
import time

import httpx

from vlserve.router.args import RouterArgs
from vlserve.server.args import ServerArgs

log = logging.getLogger(__name__)

FRONT_ONLY = ("host", "port", "api_key", "dp_size")  # the front's flags: never a child's
PR_SET_PDEATHSIG = 1


def worker_argv(args: ServerArgs, port: int) -> list[str]:
    """`vlserve serve` flags for one child: every option that differs from its default, on 127.0.0.1:port."""
    argv = ["--host", "127.0.0.1", "--port", str(port)]
    for f in dataclasses.fields(ServerArgs):
        value = getattr(args, f.name)
        if f.name in FRONT_ONLY or value == f.default:
            continue
        flag = "--" + f.name.replace("_", "-")
        argv += [flag] if value is True else [] if value is False else [flag, str(value)]
    return argv


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the front's own cleanup still stops the children
        pass


def start_workers(args: ServerArgs) -> tuple[list[subprocess.Popen], list[str]]:
    ports = free_ports(args.dp_size)
    procs = [subprocess.Popen([sys.executable, "-m", "vlserve", "serve", *worker_argv(args, port)],
                              preexec_fn=_die_with_parent) for port in ports]
    return procs, [f"http://127.0.0.1:{port}" for port in ports]


def wait_healthy(procs: list[subprocess.Popen], urls: list[str], timeout_s: float = 600.0) -> None:
    end, pending = time.monotonic() + timeout_s, set(range(len(urls)))
    while pending:
        for i in sorted(pending):
            if procs[i].poll() is not None:
                raise RuntimeError(f"engine {i} ({urls[i]}) exited with status {procs[i].returncode} while starting")
            try:
                if httpx.get(urls[i] + "/health", timeout=2).status_code == 200:
                    pending.discard(i)
            except httpx.HTTPError:
                pass
        if time.monotonic() > end:
            raise RuntimeError(f"engines {sorted(pending)} not healthy after {timeout_s:g} s")
        time.sleep(0.2)


def stop_workers(procs: list[subprocess.Popen], grace_s: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace_s + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("engine pid %d did not stop: killed", p.pid)
            p.kill()
            p.wait()


def router_args(args: ServerArgs, urls: list[str]) -> RouterArgs:
    from vlserve.model.builtin import builtin_model_path

    return RouterArgs(worker_urls=urls, model_path=args.model or builtin_model_path(), revision=args.revision,
                      chat_template=args.chat_template,
                      host=args.host, port=args.port, api_key=args.api_key, allow_url_fetch=args.allow_url_fetch,
                      log_level=args.log_level)


def serve_data_parallel(args: ServerArgs) -> int:
    from vlserve.router.serve import run_router

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    procs, urls = start_workers(args)
    log.info("data parallel: %d engines at %s", len(urls), ", ".join(urls))
    try:
        wait_healthy(procs, urls)
        return run_router(router_args(args, urls))
    except RuntimeError as e:  # an engine did not start: its own output above says why
        log.error("%s", e)
        return 1
    finally:
        stop_workers(procs, args.shutdown_timeout)
