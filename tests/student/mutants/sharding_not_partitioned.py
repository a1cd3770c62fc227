"""The sharded optimizer does not partition anything: every rank keeps the whole optimizer state."""
from _fixture import *  # noqa: F401,F403


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    return optimizer_cls(params, **kwargs)
