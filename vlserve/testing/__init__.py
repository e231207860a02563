"""Checkpoint writers for tests, examples and benchmarks: tiny random models of every served
architecture in the Hugging Face format (`vlserve make-tiny-model`), and what they share with the
built-in model's training (checkpoint_tools.py, bpe.py). Nothing here runs when serving."""
