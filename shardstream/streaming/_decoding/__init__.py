"""Turning raw samples into training values: decode modes and the crop-window fast path."""
