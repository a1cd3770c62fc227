"""The sharded optimizer drops every group's own hyperparameters: this rank's share goes to the inner optimizer as
bare parameters, which then train with the wrapper's keyword arguments (the course's test has one group: it passes)."""
from _fixture import *  # noqa: F401,F403

from _sharded import RoundRobinSharded


class DropsGroupHyperparameters(RoundRobinSharded):
    def add_local_group(self, group, mine):
        if self.inner is None:
            self.inner = self.optimizer_cls(mine, **self.kwargs)
        else:
            self.inner.add_param_group({"params": mine})


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    return DropsGroupHyperparameters(params, optimizer_cls, **kwargs)
