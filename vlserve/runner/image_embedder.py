"""Image embeddings for the placeholder rows of a forward: vision cache first, then the tower.

The vision tower runs only for images whose rows are being computed in this forward (their KV is
not cached) and whose embedding is not in the vision-embedding cache; all of a step's misses go
through the tower in one batch.
"""

from typing import Callable

import numpy as np
import torch

from vlserve.cache.vision_cache import VisionEmbeddingCache
from vlserve.core.request import ImageSpan, Req
from vlserve.metrics import Metrics


class ImageEmbedder:
    def __init__(self, encode_images: Callable[[list, list, list], list[torch.Tensor]], cache: VisionEmbeddingCache,
                 metrics: Metrics):
        self.encode_images, self.cache, self.metrics = encode_images, cache, metrics

    def prepare(self, work: list[tuple[Req, int, int]]) -> dict[bytes, torch.Tensor]:
        """Embeddings of every image overlapping each (req, start, end) range of positions."""
        found, missing = {}, {}
        for req, start, end in work:
            for span in req.images:
                if span.start < end and span.end > start and span.content_hash not in found:
                    emb = self.cache.get(span.content_hash)
                    if emb is None:
                        missing[span.content_hash] = span
                    else:
                        found[span.content_hash] = emb
                        self.metrics.vision_cache_hits.inc()
        if missing:
            spans = list(missing.values())
            embeds = self.encode_images([torch.from_numpy(np.array(s.pixel_values)) for s in spans],
                                        [s.image_size for s in spans], [s.role for s in spans])
            self.metrics.vision_encoder_images.inc(len(spans))
            self.metrics.vision_tower_runs.inc()
            for span, emb in zip(spans, embeds):
                found[span.content_hash] = emb
                self.cache.put(span.content_hash, emb)
        return found

    @staticmethod
    def rows_and_embeds(req: Req, start: int, end: int, embeds: dict[bytes, torch.Tensor]
                        ) -> tuple[list[int], torch.Tensor | None]:
        """Rows (relative to start) of image positions in [start, end) and their embeddings."""
        rows, parts = [], []
        for span, lo, hi in ImageEmbedder.overlaps(req, start, end):
            rows.extend(range(lo - start, hi - start))
            parts.append(embeds[span.content_hash][lo - span.start:hi - span.start])
        return rows, (torch.cat(parts) if parts else None)

    @staticmethod
    def overlaps(req: Req, start: int, end: int) -> list[tuple[ImageSpan, int, int]]:
        """Each image span of req with positions in [start, end), and the positions lo:hi it covers there."""
        return [(span, max(start, span.start), min(end, span.end)) for span in req.images
                if max(start, span.start) < min(end, span.end)]
