"""Triton paged-attention kernels and their PyTorch references (installed as vlserve.kernels; imports torch/triton only)."""
