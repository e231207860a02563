"""Random insert / match / lock / unlock / evict / reset sequences against a plain model.

The model maps every cached token position to its slot; a position is named by the key up to the
end of its page and its index (with pages, two keys sharing a token prefix but not the whole page
hold different slots there). The tree must hold exactly that map, and every slot ever handed out
is in exactly one place: the tree, freed by the cache (once), or given back by the test itself
(its duplicate and tail slots).
"""

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from vlserve.cache.radix_cache import MatchResult, RadixCache, TreeNode

TOKENS = st.lists(st.integers(0, 1), max_size=8)  # a small alphabet, so prefixes collide


class FreshSlots:
    """Hands out never-reused slot ids and records every free, so a double free shows."""

    def __init__(self):
        self.handed_out = 0
        self.freed: list[int] = []

    def alloc(self, n: int) -> torch.Tensor:
        slots = torch.arange(self.handed_out, self.handed_out + n, dtype=torch.int64)
        self.handed_out += n
        return slots

    def free(self, indices: torch.Tensor) -> None:
        self.freed.extend(indices.tolist())


Position = tuple[tuple[int, ...], int]


def position(key, i: int, page: int) -> Position:
    return tuple(key[: (i // page + 1) * page]), i


def tree_contents(cache: RadixCache) -> dict[Position, int]:
    contents = {}
    stack: list[tuple[TreeNode, tuple[int, ...]]] = [(cache.root, ())]
    while stack:
        node, path = stack.pop()
        for j, slot in enumerate(node.value.tolist()):
            contents[position(path + tuple(node.key), len(path) + j, cache.page_size)] = slot
        stack.extend((child, path + tuple(node.key)) for child in node.children.values())
    return contents


def path_of(cache: RadixCache, node: TreeNode) -> tuple[int, ...]:
    parts = []
    while node is not cache.root:
        parts.append(tuple(node.key))
        node = node.parent
    return tuple(tok for part in reversed(parts) for tok in part)


class RadixMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2, 4]))
    def setup(self, page_size):
        self.page = page_size
        self.pool = FreshSlots()
        self.cache = RadixCache(self.pool, page_size=page_size)
        self.model: dict[Position, int] = {}
        self.handles: list[tuple[TreeNode, tuple[int, ...]]] = []
        self.released: list[int] = []  # slots the test gave back itself
        self.keys_seen: list[list[int]] = []

    # ---- helpers ------------------------------------------------------------------------------

    def draw_key(self, data) -> list[int]:
        if self.keys_seen and data.draw(st.integers(0, 3)) > 0:  # mostly: extend a key seen before
            base = data.draw(st.sampled_from(self.keys_seen))
            key = base[: data.draw(st.integers(0, len(base)))] + data.draw(TOKENS)
        else:
            key = data.draw(TOKENS)
        self.keys_seen.append(key)
        return key

    def model_match_len(self, key: list[int]) -> int:
        length = 0
        while length + self.page <= len(key) and position(key, length, self.page) in self.model:
            length += self.page
        return length

    def check_match(self, key: list[int], match: MatchResult) -> int:
        length = self.model_match_len(key)
        assert match.prefix_len == length
        assert match.indices.tolist() == [self.model[position(key, i, self.page)] for i in range(length)]
        assert path_of(self.cache, match.node) == tuple(key[:length])
        return length

    def locked_positions(self) -> set[Position]:
        return {position(path, i, self.page) for _, path in self.handles for i in range(len(path))}

    # ---- rules --------------------------------------------------------------------------------

    @rule(data=st.data(), match_first=st.booleans())
    def insert(self, data, match_first):
        key = self.draw_key(data)
        end = len(key) - len(key) % self.page
        if match_first:  # the scheduler's way: reuse the matched slots, allocate the rest
            match = self.cache.match_prefix(key)
            reused = self.check_match(key, match)
            indices = torch.cat([match.indices, self.pool.alloc(len(key) - reused)])
        else:
            reused = 0
            indices = self.pool.alloc(len(key))
        already = self.model_match_len(key)
        assert self.cache.insert(key, indices) == already
        for i in range(already, end):
            self.model[position(key, i, self.page)] = int(indices[i])
        # the test's own slots the tree did not take: duplicates of the cached prefix, partial page
        self.released += indices[reused:already].tolist() + indices[max(end, reused) :].tolist()

    @rule(data=st.data())
    def match(self, data):
        key = self.draw_key(data)
        self.check_match(key, self.cache.match_prefix(key))

    @rule(data=st.data())
    def peek(self, data):
        key = self.draw_key(data)
        before = tree_contents(self.cache)
        assert self.cache.peek_prefix_len(key) == self.model_match_len(key)
        assert tree_contents(self.cache) == before

    @rule(data=st.data())
    def lock(self, data):
        key = self.draw_key(data)
        match = self.cache.match_prefix(key)
        length = self.check_match(key, match)
        self.cache.lock(match.node)
        self.handles.append((match.node, tuple(key[:length])))

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def unlock(self, data):
        node, _ = self.handles.pop(data.draw(st.integers(0, len(self.handles) - 1)))
        self.cache.unlock(node)

    @rule(num_tokens=st.integers(0, 12))
    def evict(self, num_tokens):
        locked = self.locked_positions()
        evictable_before = self.cache.evictable_size()
        start = len(self.pool.freed)
        freed = self.cache.evict(num_tokens)
        gone = self.pool.freed[start:]
        assert freed == len(gone) <= evictable_before
        assert freed >= num_tokens or self.cache.evictable_size() == 0
        position_of_slot = {slot: pos for pos, slot in self.model.items()}
        for slot in gone:
            assert slot in position_of_slot, f"slot {slot} freed but not cached"
            assert position_of_slot[slot] not in locked, "a locked node was evicted"
            del self.model[position_of_slot[slot]]

    @precondition(lambda self: not self.handles)
    @rule()
    def reset(self):
        start = len(self.pool.freed)
        self.cache.reset()
        assert sorted(self.pool.freed[start:]) == sorted(self.model.values())
        self.model = {}

    # ---- invariants ---------------------------------------------------------------------------

    @invariant()
    def tree_matches_model(self):
        self.cache.check_integrity()
        assert tree_contents(self.cache) == self.model
        assert self.cache.total_size() == len(self.model)

    @invariant()
    def sizes_match_locks(self):
        protected = len(self.locked_positions())
        assert self.cache.protected_size() == protected
        assert self.cache.evictable_size() == len(self.model) - protected

    @invariant()
    def every_slot_in_exactly_one_place(self):
        freed, cached, released = self.pool.freed, list(self.model.values()), self.released
        assert len(set(freed)) == len(freed), "double free"
        everywhere = freed + cached + released
        assert sorted(everywhere) == list(range(self.pool.handed_out)), "leak or slot in two places"


RadixMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRadixCacheAgainstModel = RadixMachine.TestCase
