"""Triton kernels (paged attention, KV write, RMSNorm, rotary) and their torch references."""
