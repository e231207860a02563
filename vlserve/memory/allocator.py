"""Slot allocator over the KV pool, in pages of `page_size` slots.

A page belongs to one owner (a request or a radix-tree node). Position p of a request lives in
slot `page * page_size + p % page_size`, so a request's positions fill its last page before a new
page is taken; with page_size 1 this is a plain free list of slots.
"""

import torch


class OutOfSlots(RuntimeError):
    pass


class SlotAllocator:
    def __init__(self, num_pages: int, page_size: int = 1):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.num_pages = num_pages
        self._free_pages = torch.arange(num_pages - 1, -1, -1, dtype=torch.int64).tolist()

    @property
    def capacity(self) -> int:
        return self.num_pages * self.page_size

    @property
    def num_free_slots(self) -> int:
        return len(self._free_pages) * self.page_size

    def slots_needed(self, prefix_len: int, extend_len: int) -> int:
        """Fresh slots (in whole pages) that extending a request from prefix_len by extend_len takes."""
        p = self.page_size
        used_pages = -(-prefix_len // p)
        return (-(-(prefix_len + extend_len) // p) - used_pages) * p

    def alloc_extend(self, last_slot: int, prefix_len: int, extend_len: int) -> torch.Tensor:
        """Slots for positions prefix_len .. prefix_len+extend_len-1 of one request.

        last_slot is the slot of position prefix_len-1 (ignored when prefix_len is 0 or on a
        page boundary): the rest of its page is filled first.
        """
        p = self.page_size
        if p == 1:  # the common case, and every decode step: a plain pop from the free list
            if extend_len > len(self._free_pages):
                raise OutOfSlots(f"need {extend_len} slots, {len(self._free_pages)} free")
            taken = self._free_pages[len(self._free_pages) - extend_len:]
            del self._free_pages[len(self._free_pages) - extend_len:]
            return torch.tensor(taken[::-1], dtype=torch.int64)
        need = self.slots_needed(prefix_len, extend_len)
        if need > self.num_free_slots:
            raise OutOfSlots(f"need {need} slots, {self.num_free_slots} free")
        head = min(extend_len, (-prefix_len) % p)  # room left in the last, partly filled page
        parts = []
        if head:
            parts.append(torch.arange(last_slot + 1, last_slot + 1 + head, dtype=torch.int64))
        pages = [self._free_pages.pop() for _ in range(need // p)]
        if pages:
            base = torch.tensor(pages, dtype=torch.int64).repeat_interleave(p) * p
            parts.append((base + torch.arange(p).repeat(len(pages)))[: extend_len - head])
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)

    def free(self, slots: torch.Tensor) -> None:
        """Frees the pages holding these slots. The caller owns every slot of those pages."""
        if slots.numel() == 0:
            return
        pages = torch.unique(slots.to(torch.int64) // self.page_size).tolist()
        self._free_pages.extend(pages)
