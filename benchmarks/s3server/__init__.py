"""A real S3 server (Ceph radosgw on a one-OSD cluster, 127.0.0.1 only) for benchmarks."""
