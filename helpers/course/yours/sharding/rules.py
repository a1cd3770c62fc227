"""The sharded optimizer's rules that the 2025 and 2026 handouts state in words (problem optimizer_state_sharding) and
the course's test never tries: run in a launched rank (the *_run functions, beside the course's test in
helpers.course.yours.sharding.runner) and judged in the parent (helpers.course.yours.sharding.rule_checks). Within the
contract: they count.

    groups_run(make, PROBES[0])     # params as dicts, each group with its own lr / weight decay (AdamW, then SGD)
    add_run(make)                   # add_param_group after 2 steps (layers unfrozen): sharded, then stepped
    zero_grad_run(make)             # the wrapper's zero_grad() clears every parameter's gradient, not its own share

Each run trains a chain of six equal Linear layers on the same rows on every rank (what data-parallel training hands
the optimizer once gradients are averaged) beside one process's optimizer_cls built with the same groups, and
compares the weights within a bound from the arithmetic (`bound`): an optimizer step is elementwise, so a sharded
step does what one process does up to the rounding of one update, a few units of float32's roundoff per step."""

from __future__ import annotations

import copy
import gc
import itertools
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import helpers.course.yours.course_models as CM
from helpers import memory as M

WIDTH, LAYERS = 8, 6  # six Linear(8, 8): equal tensors, so a partition by count and one by bytes agree
STEPS, ADD_AT, ROWS = 5, 2, 32  # 5 steps on 32 rows; add_param_group before step 2 (0-based)
U32 = 2.0**-24  # float32's unit roundoff
ROUNDINGS = 32  # per element per step: AdamW's update rounds about a dozen times (SGD's about 5), each by at most u
#                 of |w| or |Δw|; 32 leaves room for another order of the same operations and for what the next
#                 gradient carries of this step's rounding


class Chain(nn.Module):
    """(B, 8) -> (B, 8): six bias-free Linear(8, 8) with tanh between (no dead units: every weight gets a gradient)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS))

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))  # (B, 8)
        return self.layers[-1](x)  # (B, 8)


@dataclass(frozen=True)
class Probe:
    """An optimizer_cls with the wrapper's keyword arguments (`defaults`) and three groups of two layers each, each
    group with its own hyperparameters (`own`; the last group has none)."""

    name: str
    cls: type
    defaults: dict
    own: tuple = field(default=())

    def groups(self, net: nn.Module, drop=()) -> list[dict]:
        """The param groups over net's layers; `drop`: (group, key) pairs left out (that group takes the default)."""
        params, k = list(net.parameters()), LAYERS // len(self.own)
        return [
            {"params": params[g * k : (g + 1) * k], **{h: v for h, v in own.items() if (g, h) not in drop}}
            for g, own in enumerate(self.own)
        ]

    def pairs(self) -> list[tuple[int, str]]:
        return [(g, h) for g, own in enumerate(self.own) for h in own]

    def dropped(self, drop) -> str:
        """'group 0's own lr 0.02 (the default 0.1 taken instead)' for each dropped pair."""
        return " and ".join(
            f"group {g}'s own {h} {self.own[g][h]:g} (the default {self.default(h):g} taken instead)" for g, h in drop
        )

    def default(self, key: str) -> float:
        return self.defaults.get(key, self.cls([torch.zeros(1, requires_grad=True)]).defaults[key])


PROBES = (
    Probe("AdamW", torch.optim.AdamW, CM.SHARDING_ADAMW, ({"lr": 0.02}, {"weight_decay": 0.5}, {})),
    Probe("SGD with momentum", torch.optim.SGD, dict(lr=0.05, momentum=0.9), ({"lr": 0.01}, {"weight_decay": 0.1}, {})),
)
WIDE = 3  # ranks of wide_run: the handout partitions over dist.get_world_size(); two halves (the test's 2) is not that
WIDE_PROP = f"AdamW on {WIDE} ranks: every rank's weights vs one process's"
WIDE_STATE_PROP = f"AdamW on {WIDE} ranks: each rank keeps the state of about 1/{WIDE} of the parameters"
ADDED = {"lr": 0.05}  # the group add_param_group brings in (the last two layers, frozen until then)


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of a step, the same on every rank: inputs and targets, each (32, 8)."""
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(ROWS, WIDTH, generator=gen), torch.randn(ROWS, WIDTH, generator=gen)


def leftover_grads(opt, params: dict) -> list[str]:
    """opt.zero_grad() as the course's test calls it; the names whose gradient it left (not None, not all zero)."""
    opt.zero_grad()
    return [n for n, p in params.items() if p.grad is not None and bool(p.grad.any())]


@dataclass
class Trained:
    """One training run: the final weights, each element's path Σ_t (|w_t| + |w_t+1 - w_t|) (the bound's scale),
    the added parameters as they were when added, and the bytes the first step after adding left alive."""

    weights: dict
    path: dict
    at_add: dict | None = None
    added_state: int | None = None


def train(net: nn.Module, opt, add: list[str] = (), group: dict | None = None, measure: bool = False) -> Trained:
    """STEPS steps of mean squared error on _data; before step ADD_AT, the `add` parameters are unfrozen and added
    as one group (with `group`'s hyperparameters), and with `measure` the state that step leaves is counted. A
    gradient zero_grad() leaves is cleared here (its own check reports it), so the other checks judge their rule
    alone."""
    params = dict(net.named_parameters())
    out = Trained({}, {n: torch.zeros_like(p) for n, p in params.items()})
    for step in range(STEPS):
        if add and step == ADD_AT:
            for n in add:
                params[n].requires_grad_(True)
            opt.add_param_group({"params": [params[n] for n in add], **(group or {})})
            out.at_add = {n: params[n].detach().clone() for n in add}
        for n in leftover_grads(opt, params):
            params[n].grad = None
        x, y = _data(step)
        F.mse_loss(net(x), y).backward()
        before = {n: p.detach().clone() for n, p in params.items()}
        if measure and step == ADD_AT:  # the state the added parameters bring
            out.added_state = state_growth(opt, params)
        else:
            opt.step()
        for n, p in params.items():
            out.path[n] += before[n].abs() + (p.detach() - before[n]).abs()
    out.weights = {n: p.detach().clone() for n, p in params.items()}
    return out


def state_growth(opt, params: dict) -> int:
    """Bytes of optimizer state opt.step() adds on this rank: read from the torch optimizers the wrapper is or holds
    (state_bytes), so a buffer a step leaves for the backend to release later is not counted; where it holds none
    that can be found, the bytes of tensors the step leaves alive (the barrier: gloo lets go of its buffers)."""
    before = state_bytes(opt)
    if before is not None:
        opt.step()
        return state_bytes(opt) - before
    grads = [p.grad for p in params.values() if p.grad is not None]  # a grad has no Python object until read
    trace = M.track(lambda: (opt.step(), dist.barrier()), existing=alive_tensors() + grads)
    return trace.current_bytes - trace.baseline_bytes


def state_bytes(obj) -> int | None:
    """Bytes of the tensors in the state of every torch optimizer `obj` is or holds (a storage counted once), or None
    when it holds none."""
    return M.optimizer_state_bytes(obj) if M.optimizers_in(obj) else None


def alive_tensors() -> list[torch.Tensor]:
    """Every tensor alive in this process (the state earlier steps made included, wherever the wrapper keeps it): what
    a step that only updates in place leaves at zero growth."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance on a deprecated torch alias warns
        return [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]


def bound(path: dict) -> dict:
    """Per element: ROUNDINGS x u(float32) x Σ_t (|w_t| + |Δw_t|) of one process's run (the tiny float keeps 0/0
    out)."""
    return {n: ROUNDINGS * U32 * p + torch.finfo(torch.float32).tiny for n, p in path.items()}


# ---- in a rank ----


def groups_run(make, probe: Probe) -> dict:
    """Yours built from three dict groups with their own hyperparameters, beside one process's probe.cls with the
    same groups and with each subset of the groups' own hyperparameters dropped (what a mistake would give)."""
    torch.manual_seed(0)
    base = Chain()
    net = copy.deepcopy(base)
    mine = train(net, make(probe.groups(net), probe.cls, **probe.defaults))
    refs = []
    for n in range(len(probe.pairs()) + 1):
        for drop in itertools.combinations(probe.pairs(), n):
            ref_net = copy.deepcopy(base)
            ran = train(ref_net, probe.cls(probe.groups(ref_net, drop), **probe.defaults))
            refs.append({"drop": list(drop), "weights": ran.weights, "path": ran.path})
    return {"mine": mine.weights, "init": dict(base.state_dict()), "refs": refs, "bound": bound(refs[0]["path"])}


def add_run(make) -> dict:
    """Yours built on a list of the first four layers' weights, the last two frozen; before step 2
    they are unfrozen and added as a group with its own lr: beside one process's AdamW doing the same, and the same
    with the group's lr dropped. The state the first step after adding leaves, yours on this rank and one process's."""
    probe = PROBES[0]
    torch.manual_seed(0)
    base = Chain()
    new = [f"layers.{i}.weight" for i in range(LAYERS - 2, LAYERS)]
    for n in new:
        base.get_parameter(n).requires_grad_(False)

    def run(build, group, measure=True):
        net = copy.deepcopy(base)
        return train(net, build([p for p in net.parameters() if p.requires_grad]), new, group, measure)

    mine = run(lambda ps: make(ps, probe.cls, **probe.defaults), ADDED)
    ref = run(lambda ps: probe.cls(ps, **probe.defaults), ADDED)
    alt = run(lambda ps: probe.cls(ps, **probe.defaults), {}, measure=False)
    return {
        "mine": mine.weights,
        "at_add": mine.at_add,
        "ref": ref.weights,
        "alt": alt.weights,
        "bound": bound(ref.path),
        "held": mine.added_state,
        "full": ref.added_state,
        "new": new,
    }


def zero_grad_run(make) -> dict:
    """Two steps of yours (AdamW, every layer) and a zero_grad() before each step and after the last: the names of
    the gradients any of them left."""
    torch.manual_seed(0)
    net = Chain()
    params = dict(net.named_parameters())
    opt = make(net.parameters(), torch.optim.AdamW, **CM.SHARDING_ADAMW)
    left = set()
    for step in range(2):
        left |= set(leftover_grads(opt, params))
        x, y = _data(step)
        F.mse_loss(net(x), y).backward()
        opt.step()
    left |= set(leftover_grads(opt, params))
    return {"left": sorted(left), "names": list(params)}


def groups_prop(probe: Probe) -> str:
    return f"parameter groups with their own lr / weight decay ({probe.name})"


ADD_PROP = f"add_param_group after {ADD_AT} steps: the {{}} (AdamW)"
ZERO_GRAD_PROP = "zero_grad() clears every parameter's gradient (AdamW)"


def wide_run(make) -> dict:
    """On each of WIDE ranks: yours over a list of tensors beside one process's AdamW, STEPS steps of the probes'
    model each (as groups_run without groups), and the state the first step leaves on this rank, yours and one
    process's (LAYERS equal tensors: a partition over the world size gives each rank LAYERS / WIDE of them)."""
    torch.manual_seed(0)
    base = Chain()
    runs, held = {}, {}
    for who, build in (
        ("mine", lambda ps: make(ps, torch.optim.AdamW, **CM.SHARDING_ADAMW)),
        ("ref", lambda ps: torch.optim.AdamW(ps, **CM.SHARDING_ADAMW)),
    ):
        net = copy.deepcopy(base)
        runs[who] = train(net, build(net.parameters()))
        net = copy.deepcopy(base)
        opt = build(net.parameters())
        x, y = _data(0)
        F.mse_loss(net(x), y).backward()
        held[who] = state_growth(opt, dict(net.named_parameters()))
    mine, ref = runs["mine"], runs["ref"]
    return {
        "mine": mine.weights,
        "ref": ref.weights,
        "bound": bound(ref.path),
        "held": held["mine"],
        "full": held["ref"],
    }
