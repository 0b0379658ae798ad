"""Diagnostics: where a loader's time goes (statistics, ``shardstream bench``) and how mixed its
batches are against a random permutation (``shardstream bench --shuffle``)."""
