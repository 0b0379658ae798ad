"""What one DataLoader worker runs: cursors over windows, the shard reader and its pieces,
whole-shard mode, batches in shared memory."""
