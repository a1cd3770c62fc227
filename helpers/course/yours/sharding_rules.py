"""The sharded optimizer's rules that the 2025 and 2026 handouts state in words (problem optimizer_state_sharding) and
the course's test never tries: run in a launched rank (the *_run functions, beside the course's test in
helpers.course.yours.dist_sharding) and judged in the parent (the *_checks functions). Within the contract: they count.

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

from helpers import memory as M
from helpers.course.yours import course_models as CM
from helpers.course.yours.report import FAIL, PASS, Check

WIDTH, LAYERS = 8, 6  # six Linear(8, 8): equal tensors, so a partition by count and one by bytes agree
STEPS, ADD_AT, ROWS = 5, 2, 32  # 5 steps on 32 rows; add_param_group before step 2 (0-based)
U32 = 2.0**-24  # float32's unit roundoff
ROUNDINGS = 32  # per element per step: AdamW's update rounds 11 times, SGD's 4; doubled for the order an
#                 implementation may choose, doubled again for what the next gradient carries of it


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
        if measure and step == ADD_AT:  # the state the added parameters bring (the barrier: gloo lets go of buffers)
            grads = [p.grad for p in params.values() if p.grad is not None]  # a grad has no Python object till read
            trace = M.track(lambda: (opt.step(), dist.barrier()), existing=alive_tensors() + grads)
            out.added_state = trace.current_bytes - trace.baseline_bytes
        else:
            opt.step()
        for n, p in params.items():
            out.path[n] += before[n].abs() + (p.detach() - before[n]).abs()
    out.weights = {n: p.detach().clone() for n, p in params.items()}
    return out


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
    """Yours built (as the course's test builds it) on the first four layers, the last two frozen; before step 2
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


# ---- in the parent: the checks ----


@dataclass
class Worst:
    """The element furthest outside (or nearest to) the bound, over every rank: |diff| / bound and where."""

    ratio: float
    rank: int = 0
    name: str = ""
    index: tuple = ()
    got: float = 0.0
    want: float = 0.0
    limit: float = 0.0

    def where(self, other: str = "one process") -> str:
        return (
            f"rank {self.rank}, {self.name}[{', '.join(map(str, self.index))}]: yours {self.got:.8g}, {other} "
            f"{self.want:.8g}, |diff| {abs(self.got - self.want):.3g} against a bound of {self.limit:.3g}"
        )


def worst(mine_per_rank: list[dict], want: dict, limits: dict, names=None) -> Worst:
    """max over ranks and elements of |yours - want| / bound (inf where yours is not finite)."""
    out = Worst(-1.0)
    for rank, mine in enumerate(mine_per_rank):
        for n in names or want:
            r = torch.nan_to_num((mine[n] - want[n]).abs() / limits[n], nan=float("inf"))
            i = tuple(int(k) for k in torch.unravel_index(r.argmax(), r.shape))
            if float(r[i]) > out.ratio:
                out = Worst(float(r[i]), rank, n, i, float(mine[n][i]), float(want[n][i]), float(limits[n][i]))
    return out


BOUND_WORDS = (
    f"bound {ROUNDINGS} x 2^-24 x the sum over the steps of |w| + |Δw| (one process's run): the rounding of an "
    "update, which a sharded step repeats element by element"
)


def groups_prop(probe: Probe) -> str:
    return f"parameter groups with their own lr / weight decay ({probe.name})"


ADD_PROP = f"add_param_group after {ADD_AT} steps: the {{}} (AdamW)"
ZERO_GRAD_PROP = "zero_grad() clears every parameter's gradient (AdamW)"


def groups_check(impl: str, probe: Probe, per_rank: list[dict]) -> Check:
    """Each group's own hyperparameters honoured (2025 and 2026 handouts: params may be parameter groups with their
    own hyperparameters, e.g. a learning rate per part of the model): yours vs one process with the same groups,
    within `bound`; a miss names the dropped hyperparameters when the weights are those of one process without
    them."""
    prop = groups_prop(probe)
    refs, limits = per_rank[0]["refs"], per_rank[0]["bound"]
    mine = [r["mine"] for r in per_rank]
    best = worst(mine, refs[0]["weights"], limits)
    own = "; ".join(f"group {g}: {own or 'the defaults'}" for g, own in enumerate(probe.own))
    if best.ratio <= 1:
        detail = f"{STEPS} steps, every rank within the {BOUND_WORDS}; worst |diff| / bound {best.ratio:.3g} ({own})"
        return Check("sharding", impl, prop, PASS, detail)
    why = next(
        (
            f" - the weights are one process's with {probe.dropped(r['drop'])}: the wrapper drops that group's own "
            "hyperparameters (give the inner optimizer each group's hyperparameters with this rank's share of its "
            "parameters)"
            for r in refs[1:]
            if worst(mine, r["weights"], limits).ratio <= 1
        ),
        never_stepped(per_rank[0]["init"], mine) or unsynced(mine),
    )
    return Check("sharding", impl, prop, FAIL, f"after {STEPS} steps, {best.where()} ({BOUND_WORDS}; {own}){why}")


def never_stepped(init: dict, mine_per_rank: list[dict]) -> str:
    """' - X, Y kept their initial values on every rank: ...' for parameters no rank ever changed, else ''."""
    kept = [n for n in init if all(torch.equal(m[n], init[n]) for m in mine_per_rank)]
    if not kept:
        return ""
    return (
        f" - {', '.join(kept)} kept their initial values on every rank: never stepped (their group never reaches an "
        "optimizer that steps it)"
    )


def unsynced(mine_per_rank: list[dict], names=None) -> str:
    """' - ranks hold different X, Y: ...' when the ranks' weights differ, else ''."""
    first = mine_per_rank[0]
    split = [n for n in names or first if any(not torch.equal(m[n], first[n]) for m in mine_per_rank[1:])]
    if not split:
        return ""
    return f" - the ranks hold different {', '.join(split[:3])}: an owner's update not broadcast to the other ranks"


def add_checks(impl: str, per_rank: list[dict]) -> list[Check]:
    """add_param_group during training (2025 and 2026 handouts: it may be called during training, e.g. to unfreeze
    layers, and must assign the new parameters among the ranks): the new parameters stepped (as one process steps
    them, with the group's own lr or, for this check, the default); then the group's own lr honoured, and the state
    they bring partitioned over the ranks (both judged only once they are stepped)."""
    first, mine = per_rank[0], [r["mine"] for r in per_rank]
    new, limits = first["new"], first["bound"]
    prop = ADD_PROP.format("added parameters stepped")
    right, alt = worst(mine, first["ref"], limits), worst(mine, first["alt"], limits)
    if min(right.ratio, alt.ratio) > 1:
        frozen = [
            rank for rank, r in enumerate(per_rank) if all(torch.equal(r["mine"][n], r["at_add"][n]) for n in new)
        ]
        if len(frozen) == len(per_rank):
            why = (
                f" - {', '.join(new)} kept, on every rank, the values they had when added: never stepped (the group "
                "reaches the wrapper's param_groups but not the optimizer that steps this rank's share)"
            )
        elif frozen:
            why = (
                f" - rank(s) {frozen} kept the added parameters' values from when they were added: updated by their "
                "owner, never broadcast"
            )
        else:
            why = unsynced(mine)
        return [Check("sharding", impl, prop, FAIL, f"after {STEPS} steps, {right.where()} ({BOUND_WORDS}){why}")]
    checks = [
        Check(
            "sharding",
            impl,
            prop,
            PASS,
            f"{', '.join(new)} added before step {ADD_AT}, then stepped like one process's AdamW on every rank "
            f"(worst |diff| / bound {min(right.ratio, alt.ratio):.3g})",
        )
    ]
    lr = f"its own lr {ADDED['lr']:g}"
    checks.append(
        Check(
            "sharding",
            impl,
            ADD_PROP.format("added group's own lr"),
            PASS if right.ratio <= 1 else FAIL,
            f"the added group trains with {lr} (worst |diff| / bound {right.ratio:.3g})"
            if right.ratio <= 1
            else f"{right.where()} ({BOUND_WORDS}) - the weights are one process's with the default lr "
            f"{PROBES[0].defaults['lr']:g} instead of {lr}: add_param_group drops the group's own hyperparameters",
        )
    )
    checks.append(_added_state_check(impl, per_rank))
    return checks


ADDED_SHARE = 0.75  # of the added parameters' state, at most on one rank: half when split, all when not sharded


def _added_state_check(impl: str, per_rank: list[dict]) -> Check:
    """The state the first step after add_param_group leaves on each rank vs one process's for the added group (two
    equal tensors, after four split evenly: any balanced partition gives each rank one)."""
    full = per_rank[0]["full"]
    rank = max(range(len(per_rank)), key=lambda i: per_rank[i]["held"])
    held = per_rank[rank]["held"]
    ok = held <= ADDED_SHARE * full
    detail = (
        f"rank {rank} keeps {held} B of new optimizer state after the first step with the added group, one process "
        f"{full} B for it; bound {ADDED_SHARE:.0%} of that (one of the two equal tensors is half)"
    )
    if not ok and held >= full:
        detail += (
            " - every rank keeps the state of all the added parameters: add_param_group did not assign them among "
            "the ranks"
        )
    return Check(
        "sharding",
        impl,
        ADD_PROP.format("added parameters' state partitioned over ranks"),
        PASS if ok else FAIL,
        detail,
    )


def zero_grad_check(impl: str, per_rank: list[dict]) -> Check:
    """The wrapper is the optimizer of every parameter (2025 and 2026 handouts: it calls the Optimizer constructor
    with all of them), so its zero_grad() clears every gradient, not only those of the parameters this rank owns."""
    prop = ZERO_GRAD_PROP
    left = [r["left"] for r in per_rank]
    if not any(left):
        return Check("sharding", impl, prop, PASS, "no gradient left after zero_grad() on any rank")
    names = per_rank[0]["names"]
    detail = "; ".join(f"rank {rank} kept {', '.join(n)}" for rank, n in enumerate(left) if n)
    detail = f"after zero_grad(), {detail} (of {len(names)} parameters)"
    shares = [set(n) for n in left]
    if all(shares) and sum(len(s) for s in shares) == len(names) and set().union(*shares) == set(names):
        detail += (
            " - each rank clears only the gradients of the parameters it owns; zero_grad() must clear them all: "
            "in data-parallel training the stale gradients are all-reduced into the next step's average"
        )
    return Check("sharding", impl, prop, FAIL, detail)
