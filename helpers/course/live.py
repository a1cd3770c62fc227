"""Live controls for JupyterLab: pick a value, press Run, and the notebook's own experiment function measures it.

    live.collectives_panel(profile, op="all_reduce", size="1 MiB", ranks=2).show()  # notebook 03
    live.bucket_panel(profile, bucket_mb=1.0, backend=BACKEND, device=DEVICE).show()  # notebook 04: bucket size
    live.checkpoint_panel(profile, segment=SEGMENT or 2).show(run=SEGMENT is not None)  # notebook 07

A panel is ipywidgets controls, a Run button and a progress bar; Run calls the experiment function the notebook's
cells call (helpers.experiments.collectives.run_grid, ddp.speed_table, fsdp.checkpoint_sweep), with at least
timing.MIN_PAIRS interleaved, paired steps, then shows its table (ratios with their 95% intervals, or quartiles)
and a plot in place. Without a kernel (the exported HTML) a panel is one line naming the variable to edit: its
text/html, which helpers.writeup keeps when it drops widgets.
"""

from __future__ import annotations

import html
import time
import traceback
import types
from collections.abc import Callable

import pandas as pd

from helpers.experiments import collectives as XC
from helpers.experiments import ddp as XD
from helpers.experiments import fsdp as XF
from helpers.model import get_config
from helpers.timing import MIN_PAIRS

MiB = 2**20
NO_WIDGETS = (
    "This live control needs ipywidgets, which this Python lacks (make setup installs it; or pip install "
    "ipywidgets). The cells above measured the same thing; set the variable in this cell to measure another value."
)


class _Value:
    """A control's value where ipywidgets is not installed: show(run=True) still measures it."""

    def __init__(self, value=None, **_options):
        self.value = value


def _widgets():
    """ipywidgets, or stand-ins that only hold a value (the panel is then one line, never an ImportError)."""
    try:
        import ipywidgets as W
    except ImportError:
        return types.SimpleNamespace(Dropdown=_Value, BoundedFloatText=_Value, BoundedIntText=_Value, IntText=_Value)
    return W


class Panel:
    """Controls + Run + progress bar + output area; Run calls measure(**values) -> (table, figure or None)."""

    def __init__(self, title: str, controls: dict, measure: Callable, offline: str):
        self.title, self.controls, self.measure, self.offline = title, controls, measure, offline
        self.table: pd.DataFrame | None = None
        self.box = None
        try:
            import ipywidgets as W
        except ImportError:
            return  # no widgets: one line in place of the panel (_repr_mimebundle_); show(run=True) still measures
        self.button = W.Button(description="Run", button_style="primary", tooltip="measure with these values")
        self.progress = W.IntProgress(value=0, min=0, max=3, description="", layout=W.Layout(width="16rem"))
        self.status = W.Label("")
        self.output = W.Output()
        self.box = W.VBox(
            [
                W.HTML(f"<b>{html.escape(title)}</b>"),
                W.HBox([*controls.values(), self.button]),
                W.HBox([self.progress, self.status]),
                self.output,
            ]
        )
        self.box.add_class("live-panel")
        self.button.on_click(self.run)

    def run(self, _button=None) -> pd.DataFrame | None:
        """Measure with the controls' values and show the table and plot (an error is shown in place, not raised)."""
        import matplotlib.pyplot as plt
        from IPython.display import clear_output, display

        values = {name: w.value for name, w in self.controls.items()}
        self.button.disabled, self.progress.bar_style, self.progress.value = True, "info", 1
        self.status.value = f"measuring {', '.join(f'{k} = {v}' for k, v in values.items())} ..."
        start = time.perf_counter()
        with self.output:  # the experiment's own progress bars (tqdm) show here, then its table and plot
            clear_output()
            try:
                table, fig = self.measure(**values)
                self.progress.value = 2
                clear_output(wait=True)
                display(table.round(3))  # every table here is in ms, MiB, GB/s or ratios
                if fig is not None:
                    display(fig)
                    plt.close(fig)
                self.table = table
                self.progress.value, self.progress.bar_style = 3, "success"
                self.status.value = f"done in {time.perf_counter() - start:.1f} s"
            except Exception as exc:  # a failed measurement is shown in the panel; the kernel stays usable
                self.progress.bar_style = "danger"
                self.status.value = f"failed: {type(exc).__name__}: {exc}"
                clear_output(wait=True)
                print("".join(traceback.format_exception_only(type(exc), exc)).strip())
            finally:
                self.button.disabled = False
        return self.table

    def show(self, run: bool = False) -> None:
        """Display the panel; run: also measure its current values now, as plain outputs (a headless run's page)."""
        import matplotlib.pyplot as plt
        from IPython.display import display

        display(self)
        if run:
            table, fig = self.measure(**{name: w.value for name, w in self.controls.items()})
            display(table)
            if fig is not None:
                display(fig)
                plt.close(fig)
            self.table = table

    def _repr_mimebundle_(self, **kwargs):
        """The widget in JupyterLab; one text/html line (the variable to edit) where there is no kernel."""
        if self.box is None:
            return {"text/plain": NO_WIDGETS, "text/html": f"<p class='live-offline'>{html.escape(NO_WIDGETS)}</p>"}
        bundle = self.box._repr_mimebundle_(**kwargs)
        bundle = dict(bundle[0] if isinstance(bundle, tuple) else bundle)
        bundle["text/html"] = f"<p class='live-offline'>{self.offline}</p>"
        return bundle


def _offline(what: str, variable: str, notebook: str) -> str:
    """The exported page's line: which variable to edit (in the live cell) to measure another value."""
    return (
        f"Live control ({html.escape(what)}): it needs a running kernel. Open notebooks/{notebook} in JupyterLab "
        f"and press Run, or set <code>{html.escape(variable)}</code> in this cell and run the notebook "
        "(make writeup) to measure that value here."
    )


def _ratio_plot(table: pd.DataFrame, label: str, title: str):
    """Horizontal bars of the paired ratio per row, with its 95% interval as error bars."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 0.45 * len(table) + 1.2))
    err = [table["ratio"] - table["low"], table["high"] - table["ratio"]]
    ax.barh([str(i) for i in table.index], table["ratio"], xerr=err, color="#4c78a8", capsize=3)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel(label)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


# ---- notebook 07: checkpoint segment size ----


def checkpoint_measure(segment: int, config: dict) -> tuple[pd.DataFrame, object]:
    """fsdp.checkpoint_sweep at segment sizes [0 (none), segment], interleaved, >= MIN_PAIRS paired steps."""
    if segment < 1:
        raise ValueError(f"segment must be a positive number of blocks, got {segment}")
    sweep = XF.checkpoint_sweep(
        config["ckpt_model"],
        n_layers=config["ckpt_layers"],
        batch_size=config["ckpt_batch"],
        context_length=config["ckpt_context"],
        segments=[0, int(segment)],
        steps=max(config["ckpt_steps"], MIN_PAIRS),
    )
    table = sweep.rename(columns={"time / none": "ratio"})
    table["measurable"] = ~((table["low"] <= 1.0) & (table["high"] >= 1.0))
    fig = _ratio_plot(
        table,
        "step time / no checkpointing (95% interval)",
        f"{config['ckpt_model']}: segments of {segment} blocks, peak {table.loc[segment, 'peak_MiB']:.1f}"
        f" MiB vs {table.loc[0, 'peak_MiB']:.1f} MiB",
    )
    return table, fig


def checkpoint_panel(profile: str, segment: int = 2, config: dict | None = None) -> Panel:
    """Notebook 07 §5's live control: a checkpoint segment size (blocks), measured against no checkpointing
    (config: fsdp.PROFILES[profile], or smaller shapes for a test)."""
    W = _widgets()

    config = XF.PROFILES[profile] if config is None else config
    options = [k for k in config["segments"] if k > 0]
    choice = W.Dropdown(
        options=options,
        value=segment if segment in options else options[0],
        description="segment (blocks)",
        style={"description_width": "initial"},
    )
    blocks = config["ckpt_layers"] or get_config(config["ckpt_model"]).n_layers  # None: the model's own depth
    return Panel(
        f"Activation checkpointing, {config['ckpt_model']} ({blocks} blocks): peak memory "
        "and step time against no checkpointing",
        {"segment": choice},
        lambda segment: checkpoint_measure(segment, config),
        _offline("checkpoint segment size", "SEGMENT", "07_fsdp.ipynb"),
    )


# ---- notebook 04: bucket size ----


def bucket_measure(model: str, bucket_mb: float, config: dict, backend: str, device: str):
    """ddp.speed_table for one model with one extra bucket size: every variant's step time over torch DDP's, paired
    step by step (slowest rank), with the 95% interval."""
    if not bucket_mb > 0:
        raise ValueError(f"bucket size must be positive (MB), got {bucket_mb}")
    raw, speed = XD.speed_table(
        [model],
        sweep_model=model,
        buckets_mb=[float(bucket_mb)],
        steps=max(config["steps"], MIN_PAIRS),
        warmup=config["warmup"],
        batch_size=config["batch"],
        context_length=config["context"],
        backend=backend,
        device=device,
    )
    ratios = pd.DataFrame(XD.ratio_rows(raw))
    ratios = ratios[(ratios["field"] == "step") & (ratios["b"] == "torch_ddp 25 MB")].set_index("a")
    ratios = ratios[["ratio", "ratio_low", "ratio_high", "pairs"]].rename(
        columns={"ratio_low": "low", "ratio_high": "high"}
    )
    table = speed.set_index("variant")[["step_s", "buckets", "steps"]].join(ratios, how="inner")
    table["step_ms"] = table.pop("step_s") * 1e3
    table["measurable"] = ~((table["low"] <= 1.0) & (table["high"] >= 1.0))
    fig = _ratio_plot(table, "step time / torch DDP 25 MB (95% interval)", f"{model}, bucketed {bucket_mb:g} MB")
    return table, fig


def bucket_panel(profile: str, bucket_mb: float = 1.0, *, backend: str, device: str) -> Panel:
    """Notebook 04's live control: a bucket size (MB) for DDPBucketed, timed beside every wrapper and torch DDP."""
    W = _widgets()

    config = XD.PROFILES[profile]
    model = W.Dropdown(options=config["sizes"], value=config["sizes"][0], description="model")
    size = W.BoundedFloatText(value=bucket_mb, min=0.001, max=1000.0, step=0.05, description="bucket (MB)")
    return Panel(
        "Bucketed DDP at a bucket size of your choice, 2 ranks",
        {"model": model, "bucket_mb": size},
        lambda model, bucket_mb: bucket_measure(model, bucket_mb, config, backend, device),
        _offline("bucket size", "BUCKET_MB", "04_ddp.ipynb"),
    )


# ---- notebook 03: collective, size, ranks ----


def collectives_measure(op: str, size: str, ranks: int, grid: dict):
    """collectives.run_grid for one (collective, size, ranks) on each of the profile's backend+device pairs: the
    median call (slowest rank) with its quartiles, algbw and busbw."""
    df, todo = XC.run_grid(
        [XC.parse_size(size)],
        [op],
        [int(ranks)],
        grid["combos"],
        grid["warmup"],
        max(grid["iters"], MIN_PAIRS),
        budget_s=grid["budget_s"],
    )
    if df.empty:
        raise ValueError(
            "not run here: " + "; ".join(f"{r.backend}+{r.device}: {r.reason}" for r in todo.itertuples() if not r.run)
        )
    table = df[
        [
            "backend",
            "device",
            "world_size",
            "op",
            "size",
            "time_s",
            "p25_s",
            "p75_s",
            "algbw_GBps",
            "busbw_GBps",
            "iters",
            "wrong",
        ]
    ].set_index(["backend", "device"])
    for q in ("time", "p25", "p75"):
        table.insert(table.columns.get_loc(f"{q}_s"), f"{q}_ms", table.pop(f"{q}_s") * 1e3)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 0.45 * len(table) + 1.2))
    bw, t = table["busbw_GBps"], table["time_ms"]
    ax.barh(
        [f"{b}+{d}" for b, d in table.index],
        bw,
        xerr=[bw - bw * t / table["p75_ms"], bw * t / table["p25_ms"] - bw],
        color="#4c78a8",
        capsize=3,
    )
    ax.set_xlabel("busbw, GB/s (bars: quartiles of the calls)")
    ax.set_title(f"{op}, {size}, {ranks} ranks", fontsize=9)
    fig.tight_layout()
    return table, fig


def collectives_panel(profile: str, op: str = "all_reduce", size: str = "1 MiB", ranks: int = 2) -> Panel:
    """Notebook 03's live control: one collective at one message size on N ranks."""
    W = _widgets()

    grid = XC.PROFILE_GRID[profile]
    sizes = sorted({XC.format_size(s) for s in grid["sizes"]} | {size}, key=XC.parse_size)
    controls = {
        "op": W.Dropdown(options=list(XC.OPS), value=op, description="collective"),
        "size": W.Dropdown(options=sizes, value=size, description="size"),
        "ranks": W.BoundedIntText(value=ranks, min=2, max=8, description="ranks"),
    }
    return Panel(
        "One collective, timed on this machine",
        controls,
        lambda op, size, ranks: collectives_measure(op, size, ranks, grid),
        _offline("collective, size and ranks", "OP, SIZE and RANKS", "03_collectives.ipynb"),
    )
