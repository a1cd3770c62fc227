"""`yours` for DDP, one folder: the handout's rules (contract: the course's test; rules: how the calls are made),
the probe that watches a student's collectives in the ranks (probe), the course's LM at the handout's bucket sizes
(lm, lm_checks) and the runner that launches them all (runner)."""
