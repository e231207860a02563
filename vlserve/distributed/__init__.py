"""Tensor parallelism across processes: the group, the step rank 0 broadcasts, the worker ranks'
loop, and starting and watching those processes (docs/ARCHITECTURE.md, "Threads and processes")."""
