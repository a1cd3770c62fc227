"""Bucketed DDP that refuses buckets above 512 MB (a staging-buffer limit the student assumed): the course's test
(0.0001 to 0.01 MB) passes, the handout's own benchmark at 1000 MB raises."""
from _fixture import *  # noqa: F401,F403

from helpers.ddp import DDPBucketed


class CappedDDP(DDPBucketed):
    def __init__(self, module, bucket_size_mb):
        if bucket_size_mb > 512:
            raise ValueError(f"bucket_size_mb {bucket_size_mb} exceeds the 512 MB staging buffer")
        super().__init__(module, bucket_size_mb)


def get_ddp_bucketed(module, bucket_size_mb):
    return CappedDDP(module, bucket_size_mb)
