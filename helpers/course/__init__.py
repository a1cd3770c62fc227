"""Cross-notebook work, one floor above the per-notebook experiments (../shared/design.md, "where the structure
should go next"): what reads or runs several notebooks' experiments at once.

    answers     the answers page: every edition's questions, answered from saved results
    reference   `python -m helpers reference`: the gpu profile's work in batches, saved under data/reference/
                (reference_batches: what each batch runs, each in its own process)
    yours       `python -m helpers yours ADAPTERS`: a student's implementation checked and timed beside ours

Modules here may import experiments, the library and the infrastructure; nothing below imports them.
"""
