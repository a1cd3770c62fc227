"""`yours` for the sharded optimizer, one folder: the course's test (contract), the handout's rules its test never
tries (rules in the ranks, rule_checks in the parent) and the runner that launches them (runner)."""
