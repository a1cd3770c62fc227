"""`yours` for FSDP (2026), one folder: the course's test (contract), what a student's FSDP gathers, frees and
communicates, watched in the ranks (probe) and judged by the handout's rules (rules), the checks beyond the handout
(checks) and the runner that launches them (runner)."""
