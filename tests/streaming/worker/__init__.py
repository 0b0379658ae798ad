"""Tests of shardstream.streaming._worker (mirrors the package)."""
