"""The shard format, both ways, without torch: everything that reads or writes shard bytes.

- :mod:`~shardstream._format.tarformat`: header blocks (strict parsing, deterministic building);
- :mod:`~shardstream._format.tarreader`, :mod:`~shardstream._format.tarreader`: members, then
  samples grouped by the one key rule (:mod:`~shardstream._format.keys`);
- :mod:`~shardstream._format.tarreader`: one indexed sample by one read or a memory map;
- :mod:`~shardstream._format.tarformat`: deterministic shards;
- :mod:`~shardstream._format.shardindex`: the per-sample byte-offset index (``.idx``);
- :mod:`~shardstream._format.manifest`: what a dataset holds, written last;
- :mod:`~shardstream._format.inspection`: timm's ``_info.json``, written from the manifest;
- :mod:`~shardstream._format.codecs`: member values by extension;
- :mod:`~shardstream._format.verify`, :mod:`~shardstream._format.verify`: a whole shard read once,
  checked against the manifest.

The catalog (:mod:`shardstream._catalog`: ``index``, views, versions), the writer
(:mod:`shardstream.shardwriter`) and the streaming reader share these modules; they import
only :mod:`shardstream.errors` and :mod:`shardstream._storage`.
"""
