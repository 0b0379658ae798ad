"""Tests of shardstream.streaming.worker (mirrors the package)."""
