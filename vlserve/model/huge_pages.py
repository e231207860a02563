"""Copies of large read-mostly tensors in memory backed by 2 MiB pages where the kernel allows it.

A decode step streams every weight of the model once (the benchmark model: 180 MB in bf16). On
4 KiB pages that is one TLB miss, a page walk, per 4 KiB read, and the CPU's stream prefetchers stop
at every 4 KiB boundary. Linux backs an anonymous mapping with transparent huge pages (THP) if the
system's setting is `always`, or `madvise` (the usual default, and this host's) and the mapping was
marked with madvise(MADV_HUGEPAGE) before its pages were first touched; torch's CPU tensors come from
malloc, which never marks them. Measured (`benchmarks/huge_pages.py`: the decode-rows kernel on the
benchmark model's eight layers' packed weights, each its own, at 8 / 24 / 64 rows, two threads, a
Zen 4 EPYC, both copies timed in alternation): 1.02-1.06x in bf16 and fp32 (median and best), a
few percent of a decode step ("Nineteenth pass" in benchmarks/RESULTS.md).

Where the advice fails (THP `never`, no mmap.madvise) the copy is still made, on ordinary pages;
where no mapping can be made, the tensor is kept as it is. Either way only the page size differs.
"""

import logging
import mmap

import torch

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
MIN_BYTES = HUGE_PAGE  # smaller tensors would waste most of a huge page (and gain a TLB entry or two)


def huge_page_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of the CPU tensor `t` (contiguous) whose memory starts on a 2 MiB boundary of a fresh
    anonymous mapping marked for huge pages. `t` itself, made contiguous, where it is smaller than
    MIN_BYTES, not on the CPU, or no mapping can be made. The mapping lives as long as the copy
    (torch.frombuffer keeps a reference to it)."""
    nbytes = t.numel() * t.element_size()
    if not t.is_cpu or nbytes < MIN_BYTES:
        return t.contiguous()
    buffer = _marked_mapping(nbytes + HUGE_PAGE)  # + one page: room to start at a boundary
    if buffer is None:
        return t.contiguous()
    raw = torch.frombuffer(buffer, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    out = raw[start:start + nbytes].view(t.dtype).view(t.shape)
    out.copy_(t)  # the first touch: the kernel faults the marked range in as huge pages
    return out


def _marked_mapping(nbytes: int) -> mmap.mmap | None:
    try:
        buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError, AttributeError) as e:
        log.debug("no anonymous mapping for a huge-page copy: %s", e)
        return None
    try:
        buffer.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, AttributeError) as e:  # no THP here: ordinary pages, same contents
        log.debug("madvise(MADV_HUGEPAGE) refused: %s", e)
    return buffer


def huge_page_bytes() -> int:
    """This process's anonymous memory on huge pages now (AnonHugePages in /proc/self/smaps_rollup);
    0 where Linux does not report it."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
