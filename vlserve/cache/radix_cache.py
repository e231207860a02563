"""Radix tree from token ids to KV slot indices (RadixAttention: SGLang paper §3, Appendix A.3).

Each edge holds a run of token ids (images are pseudo-token ids, just ints here) and, for every
token, the KV slot that holds its key/value. Running requests lock the nodes on their path
(`lock_ref`); unlocked leaves are evicted least-recently-used first.

Paging: with page_size > 1 every edge is a whole number of pages. Keys are compared page by page
and truncated to whole pages on insert, so a partial page never matches and never splits a page.

Disabled cache (`disabled=True`, for --disable-radix-cache): match_prefix returns an empty match on
the root, insert stores nothing and returns 0, so callers need no branch of their own.

Recency is a monotonic operation counter, not wall-clock time, so eviction order is deterministic;
ties go to the older node (lower uid).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence

import torch


class SlotFreer(Protocol):
    def free(self, indices: torch.Tensor) -> None: ...


@dataclass(eq=False)
class TreeNode:
    key: list[int]  # edge tokens from the parent to this node
    value: torch.Tensor  # one KV slot index per key token
    parent: TreeNode | None
    uid: int
    last_access: int
    lock_ref: int = 0
    children: dict = field(default_factory=dict)  # first token (or first page tuple) -> TreeNode
    alive: bool = True

    @property
    def size(self) -> int:
        return len(self.key)

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass(frozen=True)
class MatchResult:
    indices: torch.Tensor  # slots of the longest cached prefix
    node: TreeNode  # deepest node reached; it ends exactly at the match: the handle to lock

    @property
    def prefix_len(self) -> int:
        return int(self.indices.shape[0])


def _as_tokens(key: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(key, list):
        return key
    if isinstance(key, torch.Tensor):
        return key.tolist()
    return list(key)


class _NoSlots:
    """The freer of a key-only tree: its values are not pool slots, nothing is given back."""

    def free(self, indices: torch.Tensor) -> None:
        pass


def key_trie() -> "RadixCache":
    """A radix tree over token ids whose values are the caller's own (ordering and sharing decisions
    in the scheduler): same matching, no slots behind it."""
    return RadixCache(_NoSlots())


class RadixCache:
    def __init__(
        self,
        allocator: SlotFreer,
        page_size: int = 1,
        disabled: bool = False,
        device: torch.device | str = "cpu",
    ):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.allocator = allocator
        self.page_size = page_size
        self.disabled = disabled
        self.device = torch.device(device)
        self._empty = torch.empty(0, dtype=torch.int64, device=self.device)
        self._init_tree()

    def _init_tree(self) -> None:
        self._clock = 0
        self._uids = itertools.count()
        self.root = TreeNode(key=[], value=self._empty, parent=None, uid=next(self._uids), last_access=0)
        self.root.lock_ref = 1  # root is always protected
        self._evictable = 0
        self._protected = 0
        self._num_nodes = 0  # excluding the root
        self._lru_heap: list[tuple[int, int, TreeNode]] = []  # lazy: stale entries skipped on pop

    # ---- sizes (tokens), kept incrementally -------------------------------------------------------

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    # ---- lookups ----------------------------------------------------------------------------------

    def match_prefix(self, key: Sequence[int] | torch.Tensor) -> MatchResult:
        """Longest cached prefix of key, in whole pages. Splits the edge where the match ends and
        marks the path as just used."""
        if self.disabled:
            return MatchResult(self._empty, self.root)
        tokens = _as_tokens(key)
        node, _, parts = self._descend(tokens, self._whole_pages(len(tokens)))
        return MatchResult(torch.cat(parts) if parts else self._empty, node)

    def peek_prefix_len(self, key: Sequence[int] | torch.Tensor) -> int:
        """Length match_prefix would return, without splitting or touching recency (for ordering)."""
        if self.disabled:
            return 0
        tokens = _as_tokens(key)
        end = self._whole_pages(len(tokens))
        node, pos = self.root, 0
        while pos < end:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            matched = self._edge_match_len(child.key, tokens, pos, end)
            pos += matched
            if matched < child.size:
                break
            node = child
        return pos

    # ---- updates ----------------------------------------------------------------------------------

    def insert(self, key: Sequence[int] | torch.Tensor, indices: torch.Tensor) -> int:
        """Caches key -> indices (key cut to whole pages). Returns how much of that was already
        cached: the tree keeps its own slots there and the caller frees its duplicates (and any
        slots past the last whole page). Never frees anything itself."""
        tokens = _as_tokens(key)
        if not isinstance(indices, torch.Tensor) or indices.dim() != 1:
            raise ValueError("indices must be a 1-D tensor of KV slot indices")
        if indices.shape[0] != len(tokens):
            raise ValueError(f"key has {len(tokens)} tokens but indices has {indices.shape[0]} slots")
        if self.disabled:
            return 0
        end = self._whole_pages(len(tokens))
        node, pos, _ = self._descend(tokens, end)
        if pos < end:
            leaf = self._new_node(tokens[pos:end], indices[pos:end].to(torch.int64).clone(), node)
            node.children[self._child_key(leaf.key, 0)] = leaf
            self._evictable += leaf.size
            self._push_if_evictable(leaf)
        return pos

    def lock(self, node: TreeNode) -> None:
        """Protects node and its ancestors from eviction (one count per holder)."""
        self._check_alive(node)
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= node.size
                self._protected += node.size
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        self._check_alive(node)
        # a child never holds more locks than its parent, so checking the start node suffices
        if node is not self.root and node.lock_ref <= 0:
            raise AssertionError("unlock of a radix node that is not locked")
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += node.size
                self._protected -= node.size
                self._push_if_evictable(node)
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Evicts unlocked leaves, least recently used first, until num_tokens are freed or nothing
        is evictable. Returns the number of tokens freed."""
        parts: list[torch.Tensor] = []
        freed = 0
        while freed < num_tokens and self._lru_heap:
            stamp, _, node = heapq.heappop(self._lru_heap)
            if node.last_access != stamp or not self._is_evictable_leaf(node):
                continue  # stale entry
            parent = node.parent
            del parent.children[self._child_key(node.key, 0)]
            node.alive = False
            node.parent = None
            self._evictable -= node.size
            self._num_nodes -= 1
            freed += node.size
            parts.append(node.value)
            self._push_if_evictable(parent)  # it may just have lost its last child
        if parts:
            self.allocator.free(torch.cat(parts))
        return freed

    def reset(self) -> None:
        """Drops every node, locked or not, and frees all their slots. Old handles become invalid."""
        nodes = list(self.iter_nodes())
        for node in nodes:
            node.alive = False
        if nodes:
            self.allocator.free(torch.cat([node.value for node in nodes]))
        self._init_tree()

    # ---- inspection (tests, debugging) --------------------------------------------------------------

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every node but the root, depth first, children in key order."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node is not self.root:
                yield node
            stack.extend(node.children[k] for k in sorted(node.children, reverse=True))

    def shape(self) -> dict:
        """The tree as nested dicts {edge tokens tuple: subtree}."""

        def subtree(node: TreeNode) -> dict:
            return {tuple(child.key): subtree(child) for child in node.children.values()}

        return subtree(self.root)

    def pretty(self) -> str:
        lines = []
        for node in self.iter_nodes():
            depth = self._depth(node)
            lines.append(f"{'  ' * (depth - 1)}{node.key} lock={node.lock_ref} t={node.last_access}")
        return "\n".join(lines)

    def check_integrity(self) -> None:
        """Recomputes every invariant from scratch; raises AssertionError on the first broken one."""
        evictable = protected = count = 0
        for node in self.iter_nodes():
            count += 1
            assert node.alive and node.parent is not None
            assert node.parent.children.get(self._child_key(node.key, 0)) is node
            assert node.size > 0 and node.size % self.page_size == 0
            assert node.value.shape[0] == node.size
            assert node.lock_ref >= 0
            assert node.parent is self.root or node.lock_ref <= node.parent.lock_ref
            if node.lock_ref == 0:
                evictable += node.size
            else:
                protected += node.size
        assert (evictable, protected, count) == (self._evictable, self._protected, self._num_nodes)

    # ---- internals --------------------------------------------------------------------------------

    def _descend(self, tokens: list[int], end: int) -> tuple[TreeNode, int, list[torch.Tensor]]:
        """Walks tokens[:end] down the tree, splitting the edge where the match stops and marking
        every node passed as used now. Returns (last node, matched length, slot tensors)."""
        self._clock += 1
        node, pos, parts = self.root, 0, []
        while pos < end:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            matched = self._edge_match_len(child.key, tokens, pos, end)
            if matched < child.size:
                child = self._split(child, matched)
            child.last_access = self._clock
            self._push_if_evictable(child)
            parts.append(child.value)
            node, pos = child, pos + matched
        return node, pos, parts

    def _split(self, node: TreeNode, at: int) -> TreeNode:
        """Cuts node's edge at `at` (a page boundary); the new upper node takes the first part.

        The upper node inherits lock_ref: every lock through node also passes through it."""
        upper = self._new_node(node.key[:at], node.value[:at], node.parent)
        upper.lock_ref = node.lock_ref
        upper.last_access = node.last_access
        node.parent.children[self._child_key(node.key, 0)] = upper
        node.key, node.value, node.parent = node.key[at:], node.value[at:], upper
        upper.children[self._child_key(node.key, 0)] = node
        return upper

    def _new_node(self, key: list[int], value: torch.Tensor, parent: TreeNode) -> TreeNode:
        self._num_nodes += 1
        return TreeNode(key=key, value=value, parent=parent, uid=next(self._uids), last_access=self._clock)

    def _edge_match_len(self, edge: list[int], tokens: list[int], start: int, end: int) -> int:
        """Common prefix of edge and tokens[start:end], rounded down to whole pages."""
        n = min(len(edge), end - start)
        if tokens[start : start + n] == edge[:n]:  # fast path: whole edge matches
            return n
        matched = 0
        while tokens[start + matched] == edge[matched]:
            matched += 1
        return matched - matched % self.page_size

    def _child_key(self, tokens: list[int], start: int):
        if self.page_size == 1:
            return tokens[start]
        return tuple(tokens[start : start + self.page_size])

    def _whole_pages(self, length: int) -> int:
        return length - length % self.page_size

    def _is_evictable_leaf(self, node: TreeNode) -> bool:
        return node.alive and node.lock_ref == 0 and not node.children

    def _push_if_evictable(self, node: TreeNode) -> None:
        if not self._is_evictable_leaf(node):
            return
        heapq.heappush(self._lru_heap, (node.last_access, node.uid, node))
        if len(self._lru_heap) > 2 * self._num_nodes + 64:  # drop stale entries, amortised O(1)
            self._lru_heap = [
                (n.last_access, n.uid, n) for n in self.iter_nodes() if self._is_evictable_leaf(n)
            ]
            heapq.heapify(self._lru_heap)

    def _check_alive(self, node: TreeNode) -> None:
        if not node.alive:
            raise ValueError("radix node is no longer in the tree (evicted or reset)")

    def _depth(self, node: TreeNode) -> int:
        depth = 0
        while node is not self.root:
            node, depth = node.parent, depth + 1
        return depth
