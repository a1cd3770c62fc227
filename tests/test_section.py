"""helpers.section: a section's Result shows its notes, table, figure and where it was saved; source() shows the code
that ran, read from the package (a Triton kernel's Python function too)."""

import inspect

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from helpers import ddp, section  # noqa: E402
from helpers.results import ROOT  # noqa: E402


def test_a_result_shows_notes_table_figure_and_where_it_was_saved():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 2])
    table = pd.DataFrame({"ms": [1.5, 2.5]}, index=["a", "b"])
    r = section.Result(table, fig, ["b takes 1.67x a's time."], ROOT / "data" / "local" / "x.jsonl", {"ratio": 1.67})
    page = r._repr_html_()
    assert page.index("b takes 1.67x") < page.index("<table") < page.index("data:image/png;base64,")
    assert "data/local/x.jsonl" in page and str(ROOT) not in page  # relative: pages never show the clone's path
    text = repr(r)
    assert text.startswith("b takes 1.67x") and "2.5" in text and r.values["ratio"] == 1.67
    assert fig.number not in plt.get_fignums()  # the figure was embedded and closed: not drawn twice


def test_source_is_read_from_the_running_package_and_folded():
    shown = section.source(ddp.DDPBucketed, ddp.plan_buckets)
    [(where, code), (where2, code2)] = shown.blocks()
    assert where == "helpers/ddp.py · DDPBucketed" and code == inspect.getsource(ddp.DDPBucketed)
    assert where2 == "helpers/ddp.py · plan_buckets" and code2 == inspect.getsource(ddp.plan_buckets)
    page = shown._repr_html_()
    assert page.count('<details class="source">') == 2 and "style=" in page  # inline colours: no stylesheet
    assert "def plan_buckets" in repr(shown)
    with pytest.raises(ValueError, match="at least one"):
        section.source()


def test_source_of_a_triton_kernel_is_its_python_function():
    from helpers import rmsnorm

    if rmsnorm.triton is None:
        pytest.skip("no Triton here")
    [(where, code)] = section.source(rmsnorm.rmsnorm_fwd_kernel).blocks()
    assert where.startswith("helpers/rmsnorm.py · ") and "def rmsnorm_fwd_kernel" in code


def test_a_subclass_keeps_the_plain_text_view():
    """A section's own @dataclass subclass of Result gets a generated __repr__; IPython's text/plain (what the
    writeup's left-out notes read) must still be the notes and table, not a dump of the fields."""
    from dataclasses import dataclass, field

    from IPython.lib.pretty import pretty

    @dataclass
    class WithTraces(section.Result):
        traces: dict = field(default_factory=dict)

    r = WithTraces(notes=["left out of the budget: large"], traces={"forward": object()})
    assert pretty(r) == "left out of the budget: large"


def test_source_of_a_decorated_function_is_its_own_code():
    """A @contextmanager function (helpers.comm.no_python_refs) is shown from its own file, not contextlib's."""
    from helpers import comm

    [(where, code)] = section.source(comm.no_python_refs).blocks()
    assert where.startswith("helpers/comm.py") and "def no_python_refs" in code
