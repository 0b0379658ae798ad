"""The shard format, both ways, without torch: everything that reads or writes shard bytes.

- :mod:`~shardstream.format.tarheader`: header blocks (strict parsing, deterministic building);
- :mod:`~shardstream.format.tarreader`, :mod:`~shardstream.format.samples`: members, then
  samples grouped by the one key rule (:mod:`~shardstream.format.keys`);
- :mod:`~shardstream.format.tarfast`: one indexed sample by one read or a memory map;
- :mod:`~shardstream.format.tarwriter`: deterministic shards;
- :mod:`~shardstream.format.shardindex`: the per-sample byte-offset index (``.idx``);
- :mod:`~shardstream.format.manifest`: what a dataset holds, written last;
- :mod:`~shardstream.format.timminfo`: timm's ``_info.json``, written from the manifest;
- :mod:`~shardstream.format.codecs`: member values by extension;
- :mod:`~shardstream.format.scan`, :mod:`~shardstream.format.verify`: a whole shard read once,
  checked against the manifest.

The catalog (:mod:`shardstream.catalog`: ``index``, views, versions), the writer
(:mod:`shardstream.shardwriter`) and the streaming reader share these modules; they import
only :mod:`shardstream.errors` and :mod:`shardstream.storage`.
"""
