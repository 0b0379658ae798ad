"""Epoch planning: which samples each rank and DataLoader worker reads, in which order.

Torch-free and I/O-free: every function takes counts, seeds and the layout (world size,
workers, batch size) as arguments, so every process derives the same plan without talking to
the others, and tests need no processes.
"""
