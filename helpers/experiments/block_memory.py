"""One Transformer block's memory, measured (the 2026 handout's memory_profiling (f), notebook 01 §5): the bytes it
saves for backward, by the op that made them, and its gradients' bytes, on a cpu preset of the handout's own model
(cs336-basics: SwiGLU, RoPE), beside the closed forms (formulas.block_saved_parts, the block's parameter bytes).

    r = block_memory_section("xl-2026/cpu", batch_size=4, contexts=(32, 512))
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from helpers import formulas, memory
from helpers.model import build_model, get_config, lm_loss, parameter_shapes, random_batch
from helpers.results import save_results
from helpers.section import Result

MiB = 2**20


def block_memory(size: str, batch_size: int, context_length: int, block: int = 0) -> dict:
    """Run one forward and backward under memory.track: the storages made inside `blocks.<block>` still live when
    the forward ends (what the block saves for backward, its output included), grouped by op; and after backward the
    bytes of that block's parameter gradients. Beside the closed forms. The model is cut to block + 1 layers: a
    block's bytes do not depend on how many blocks follow it."""
    cfg = get_config(size, n_layers=block + 1)
    torch.manual_seed(0)
    lm = build_model(cfg)
    x, y = random_batch(cfg, batch_size, context_length)
    prefix = f"TransformerLM.blocks.{block}"
    trace = memory.track(lambda: lm_loss(lm(x), y), existing=memory.model_state(lm, None, x, y), model=lm)
    mine = [a for a in trace.live.values() if a.module == prefix or a.module.startswith(prefix + ".")]
    by_op = pd.Series([a.nbytes for a in mine], index=[a.op for a in mine]).groupby(level=0).sum()
    trace.result.backward()
    grads = sum(p.grad.untyped_storage().nbytes() for p in lm.blocks[block].parameters())
    closed = formulas.block_saved_parts(cfg, batch_size, context_length)
    block_params = sum(math.prod(s) for k, s in parameter_shapes(cfg).items() if k.startswith(f"blocks.{block}."))
    return {
        "by_op": by_op.sort_values(ascending=False),
        "saved": int(by_op.sum()),
        "saved_formula": sum(closed.values()),
        "formula_parts": closed,
        "grads": grads,
        "grads_formula": 4 * block_params,
    }


def block_memory_section(size: str, batch_size: int, contexts, *, profile: str) -> Result:
    """block_memory at each context: saved bytes and the five largest ops' share, gradients, each against its
    closed form (equal, byte for byte, or the run raises); saved as 01_block_memory."""
    rows, notes = [], []
    for T in contexts:
        m = block_memory(size, batch_size, T)
        if m["saved"] != m["saved_formula"] or m["grads"] != m["grads_formula"]:
            raise AssertionError(
                f"{size} at {batch_size} × {T}: one block saved {m['saved']} bytes (formula {m['saved_formula']}) "
                f"and its gradients take {m['grads']} (formula {m['grads_formula']})"
            )
        top = m["by_op"].head(5)
        rows.append(
            {
                "context": T,
                "saved_MiB": m["saved"] / MiB,
                "saved_formula_MiB": m["saved_formula"] / MiB,
                "top5_share": float(top.sum() / m["saved"]),
                "top5_ops": ", ".join(f"{op} {b / MiB:.2f} MiB" for op, b in top.items()),
                "grads_MiB": m["grads"] / MiB,
                "grads_formula_MiB": m["grads_formula"] / MiB,
            }
        )
        notes.append(
            f"context {T}: one block saves {m['saved'] / MiB:.2f} MiB for backward, byte for byte the closed form; "
            f"its 5 largest ops hold {top.sum() / m['saved']:.0%} of it ({rows[-1]['top5_ops']}); its gradients "
            f"take {m['grads'] / MiB:.2f} MiB, its parameters' bytes"
        )
    table = pd.DataFrame(rows).set_index("context")
    saved = save_results(
        table.reset_index(), "01_block_memory", profile=profile, model=size, batch_size=batch_size, block=0
    )
    values = {"rows": rows}
    return Result(table=table.drop(columns=["top5_ops"]), notes=notes, saved=saved, values=values)
