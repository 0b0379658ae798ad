"""What one DataLoader worker runs: reading pieces, the epoch channel, batches in shared memory."""
