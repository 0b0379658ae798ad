"""The shard format, both ways, without torch: everything that reads or writes shard bytes.

- :mod:`~shardstream._format.tarformat`: header blocks (strict parsing, deterministic building)
  and deterministic shards;
- :mod:`~shardstream._format.tarreader`: members, then samples grouped by the one key rule
  (:mod:`~shardstream._format.keys`, with the content digests), and one indexed sample by one
  read or a memory map;
- :mod:`~shardstream._format.shardindex`: the per-sample byte-offset index (``.idx``);
- :mod:`~shardstream._format.manifest` and :mod:`~shardstream._format.shardtable`: what a
  dataset holds, written last, and its shards in a few flat arrays;
- :mod:`~shardstream._format.exclusions` and :mod:`~shardstream._format.columns`: samples a
  version leaves out or a view keeps, and fields attached by key with predicates over them;
- :mod:`~shardstream._format.inspection`: what ``inspect`` shows, and timm's ``_info.json``;
- :mod:`~shardstream._format.codecs`: member values by extension (pixel members included);
- :mod:`~shardstream._format.verify`: a whole shard read once (scan), checked against the
  manifest, images decoded on request.

The catalog (:mod:`shardstream._catalog`: ``index``, views, versions), the writer
(:mod:`shardstream.shardwriter`) and the streaming reader share these modules; they import
only :mod:`shardstream.errors` and :mod:`shardstream._storage`.
"""
