"""The req_to_token table: row r, column p = the KV slot of request r's token at position p."""

import torch


class ReqToTokenPool:
    def __init__(self, max_requests: int, max_context_len: int, device: str | torch.device = "cpu"):
        self.table = torch.zeros(max_requests, max_context_len, dtype=torch.int32, device=device)
        self.max_context_len = max_context_len
        self._free_rows = list(range(max_requests - 1, -1, -1))

    def alloc(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free(self, row: int) -> None:
        self._free_rows.append(row)

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.table[row, start:start + len(slots)] = slots.to(torch.int32)

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        return self.table[row, start:end].to(torch.int64)
