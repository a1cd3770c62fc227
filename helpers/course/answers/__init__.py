"""The answers page (writeups/answers.html): every question of the course's three editions, answered in a sentence or
two from the results this machine saved (`helpers.results`), grouped by edition and named as each edition names them.

    write_page(Path("writeups/answers.html"), profile="cpu")   # after the notebooks ran; reads data/local/<device>/
    QUESTIONS                                                  # every edition's questions (rows of core.Question)

One module per notebook holds its questions (rows of data) and the functions that answer them; `core` holds what they
share (reading saved results, the comparison sentences, the statuses), `page` the HTML. A question two editions share
is one row with both years: answered once, in the first edition's section, and listed in each edition's map (handout
problem id and letter -> the answer's anchor -> the notebook section's anchor). The header counts each status: measured
here, closed form, partial (with what is missing), needs a GPU, not run yet.
"""

# isort: off
from helpers.course.answers import (  # noqa: F401  (each registers its questions; this order is the page's)
    nb01,
    nb01_precision,
    nb01_memory,
    nb01_since_2025,
    nb02,
    nb03,
    nb04,
    nb05,
    nb06,
    nb06_naive,
    nb07,
    nb07_fsdp,
    nb07_calcs,
)

# isort: on
from helpers.course.answers.core import (
    ANSWERS,
    BY_NUMBER,
    QUESTIONS,
    STATUSES,
    WRITEUP,
    ZERO1,
    Answer,
    Answered,
    NeedsGPU,
    NotMeasured,
    Question,
    Reference,
    Saved,
    answer,
    answers,
    compare_text,
    series_text,
)
from helpers.course.answers.page import EDITIONS, NOTEBOOKS, render, write_page

__all__ = [
    "ANSWERS",
    "BY_NUMBER",
    "EDITIONS",
    "NOTEBOOKS",
    "QUESTIONS",
    "WRITEUP",
    "ZERO1",
    "Answer",
    "Answered",
    "NeedsGPU",
    "NotMeasured",
    "Question",
    "Reference",
    "STATUSES",
    "Saved",
    "answer",
    "answers",
    "compare_text",
    "render",
    "series_text",
    "write_page",
]
