"""One worker as the router sees it: its address, its approximate cache, its load, its health."""

from dataclasses import dataclass

from vlserve.router.tree import ApproxTree


@dataclass(eq=False)
class Worker:
    url: str
    index: int  # its place in --worker-urls: the last tie-breaker, so choices are deterministic
    tree: ApproxTree
    load: int = 0  # requests sent and not yet ended (their stream finished or failed)
    healthy: bool = True

    def acquire(self) -> None:
        self.load += 1

    def release(self) -> None:
        # every acquire is paired with exactly one release (proxy.py's finally blocks)
        self.load -= 1
        assert self.load >= 0, f"worker {self.url}: load below zero"

    def take_out(self) -> None:
        """Failed: no more requests until a health check passes; what it cached is gone with it."""
        self.healthy = False
        self.tree.clear()
