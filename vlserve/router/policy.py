"""SGLang's cache-aware routing policy, over the engine's own keys (images included).

Balanced loads: the worker whose tree matches the longest prefix of the key, if that prefix is over
cache_threshold of the key; else the least loaded. Unbalanced loads (max - min > balance_abs_threshold
and max > balance_rel_threshold * min): the least loaded, whatever is cached. Ties go to the smaller
tree (room for a new prefix), then to the lower index: the same state always gives the same worker.
"""

from dataclasses import dataclass
from typing import Sequence

from vlserve.router.worker import Worker


@dataclass(frozen=True)
class PolicyConfig:
    cache_threshold: float = 0.3  # share of the key that must be cached for a cache-aware choice
    balance_abs_threshold: int = 64  # loads are unbalanced when max - min exceeds this ...
    balance_rel_threshold: float = 1.5  # ... and max exceeds this times min

    def __post_init__(self):
        if not 0 <= self.cache_threshold <= 1:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1:
            raise ValueError("balance_abs_threshold must be >= 0 and balance_rel_threshold >= 1")


@dataclass(frozen=True)
class Choice:
    worker: Worker
    matched: int  # tokens of the key its tree holds
    cache_hit: bool  # chosen for its cache (else for its load)


def is_balanced(loads: Sequence[int], config: PolicyConfig) -> bool:
    low, high = min(loads), max(loads)
    return not (high - low > config.balance_abs_threshold and high > low * config.balance_rel_threshold)


def choose(workers: Sequence[Worker], key: list[int] | None, config: PolicyConfig) -> Choice:
    """The worker for a request with this key (None: no key, load alone). workers: the healthy ones."""
    if not workers:
        raise ValueError("no worker to choose from")
    matches = [w.tree.match_len(key) if key else 0 for w in workers]
    if key and is_balanced([w.load for w in workers], config):
        best = max(range(len(workers)), key=lambda i: (matches[i], -workers[i].load, -workers[i].index))
        if matches[best] > config.cache_threshold * len(key):
            return Choice(workers[best], matches[best], cache_hit=True)
    least = min(range(len(workers)), key=lambda i: (workers[i].load, workers[i].tree.size(), workers[i].index))
    return Choice(workers[least], matches[least], cache_hit=False)


def record(choice: Choice, key: list[int] | None) -> None:
    """The chosen worker will cache the key: its tree says so from now on."""
    if key:
        choice.worker.tree.insert(key)
