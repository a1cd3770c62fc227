"""The checks of the sharded optimizer's rules from the 2025 and 2026 handouts' words (helpers.course.yours.
sharding_rules runs them in the ranks): from each rank's results, pass or fail with where the weights differ, by how
much against the bound, and the mistake when the weights are those of a recognisable one (a group's own lr dropped,
parameters never stepped, an update never broadcast)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from helpers.course.yours.report import FAIL, PASS, Check
from helpers.course.yours.sharding.rules import (
    ADD_AT,
    ADD_PROP,
    ADDED,
    LAYERS,
    PROBES,
    ROUNDINGS,
    STEPS,
    WIDE,
    WIDE_PROP,
    WIDE_STATE_PROP,
    ZERO_GRAD_PROP,
    Probe,
    groups_prop,
)

BOUND_WORDS = (
    f"bound {ROUNDINGS} x 2^-24 x the sum over the steps of |w| + |Δw| (one process's run): the rounding of an "
    "update, which a sharded step repeats element by element"
)


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


def worst(mine_per_rank: list[dict], want: dict, limits: dict) -> Worst:
    """max over ranks and elements of |yours - want| / bound (inf where yours is not finite)."""
    out = Worst(-1.0)
    for rank, mine in enumerate(mine_per_rank):
        for n in want:
            r = torch.nan_to_num((mine[n] - want[n]).abs() / limits[n], nan=float("inf"))
            i = tuple(int(k) for k in torch.unravel_index(r.argmax(), r.shape))
            if float(r[i]) > out.ratio:
                out = Worst(float(r[i]), rank, n, i, float(mine[n][i]), float(want[n][i]), float(limits[n][i]))
    return out


def groups_check(impl: str, probe: Probe, per_rank: list[dict]) -> Check:
    """Each group's own hyperparameters honoured (2025 handout section 3 and 2026 section 6, problem
    optimizer_state_sharding: params may be parameter groups with their own hyperparameters, e.g. a learning rate
    per part of the model, and optimizer_cls is any torch optimizer): yours vs one process with the same groups,
    within `bound`; a miss names the dropped hyperparameters when the weights are those of one process without
    them."""
    prop = groups_prop(probe)
    refs, limits = per_rank[0]["refs"], per_rank[0]["bound"]
    mine = [r["mine"] for r in per_rank]
    best = worst(mine, refs[0]["weights"], limits)
    own = "; ".join(
        f"group {g}: {', '.join(f'{h} {v:g}' for h, v in own.items()) or 'the defaults'}"
        for g, own in enumerate(probe.own)
    )
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


def unsynced(mine_per_rank: list[dict]) -> str:
    """' - ranks hold different X, Y: ...' when the ranks' weights differ, else ''."""
    first = mine_per_rank[0]
    split = [n for n in first if any(not torch.equal(m[n], first[n]) for m in mine_per_rank[1:])]
    if not split:
        return ""
    return f" - the ranks hold different {', '.join(split[:3])}: an owner's update not broadcast to the other ranks"


def add_checks(impl: str, per_rank: list[dict]) -> list[Check]:
    """add_param_group during training (2025 section 3, 2026 section 6: it may be called during training, e.g. to
    unfreeze layers, and must assign the new parameters among the ranks): the new parameters stepped (as one process
    steps them, with the group's own lr or, for this check, the default); then the group's own lr honoured, and the
    state they bring partitioned over the ranks (both judged only once they are stepped)."""
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
    equal tensors, after four split evenly: any balanced partition gives each rank one). The handouts: each rank
    keeps the state of about 1/world_size of the parameters, and add_param_group assigns new ones among the ranks."""
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
    """The wrapper is the optimizer of every parameter (2025 section 3, 2026 section 6: it calls the Optimizer
    constructor with all of them, each rank then stepping its share), so its zero_grad() clears every gradient, not
    only those of the parameters this rank owns."""
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


def wide_check(impl: str, per_rank: list[dict]) -> Check:
    """The partition follows the world size (2025 section 3, 2026 section 6: each of the world_size ranks steps its
    share and sends it to all the others): on WIDE ranks, every rank's weights within `bound` of one process's."""
    best = worst([r["mine"] for r in per_rank], per_rank[0]["ref"], per_rank[0]["bound"])
    if best.ratio <= 1:
        detail = f"{STEPS} steps, every rank within the {BOUND_WORDS}; worst |diff| / bound {best.ratio:.3g}"
        return Check("sharding", impl, WIDE_PROP, PASS, detail)
    behind = sorted({rank for rank, r in enumerate(per_rank) if worst([r["mine"]], r["ref"], r["bound"]).ratio > 1})
    ranks = f"rank {behind[0]} of {WIDE} differs" if len(behind) == 1 else f"ranks {behind} of {WIDE} differ"
    detail = (
        f"{best.where()} ({BOUND_WORDS}); {ranks} - the handout shards "
        "over the world size (dist.get_world_size()): a partition into two halves, or an owner's update sent to one "
        f"other rank, leaves a rank of {WIDE} behind"
    )
    return Check("sharding", impl, WIDE_PROP, FAIL, detail)


def wide_state_check(impl: str, per_rank: list[dict]) -> Check:
    """Each rank keeps the state of about 1/world_size of the parameters (the handouts' sharded optimizer): on WIDE
    ranks and LAYERS equal tensors, a partition by whole tensors gives each rank ceil(LAYERS / WIDE) of them; a rank
    keeping more holds another world size's share (two halves on three ranks: three tensors, and one rank idle)."""
    full = per_rank[0]["full"]
    share = -(-LAYERS // WIDE)
    limit = share * full / LAYERS
    held = [r["held"] for r in per_rank]
    rank = max(range(len(held)), key=held.__getitem__)
    detail = (
        f"rank {rank} keeps {held[rank]} B of optimizer state after the first step, one process {full} B for "
        f"{LAYERS} equal tensors; bound {share} tensors' state ({limit:.0f} B): a partition over {WIDE} ranks"
    )
    if held[rank] > limit:
        detail += f" - per rank {', '.join(f'{b} B' for b in held)}: " + (
            "every rank keeps the whole state: not partitioned"
            if held[rank] >= full
            else f"the partition does not follow the world size (dist.get_world_size()), as the handout's 1/{WIDE} asks"
        )
    return Check("sharding", impl, WIDE_STATE_PROP, PASS if held[rank] <= limit else FAIL, detail)
