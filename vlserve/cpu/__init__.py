"""What the model needs from the CPU and the process around it: the GEMM path of every linear layer
(gemm.py), thread counts (threads.py), glibc malloc kept from unmapping freed activations
(allocator.py) and the pages the first big batch writes touched at start (prefault.py)."""
