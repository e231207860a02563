"""What the model needs from the CPU and the process around it: the GEMM path of every linear layer
(gemm.py), a tied embedding's rows read from its LM head's packed layout (tied_embedding.py), thread
counts (threads.py), glibc malloc kept from unmapping freed activations (allocator.py) and the pages
the first big batch writes touched at start (prefault.py)."""
