"""A stand-in for the `cs336_basics` package every edition ships beside the assignment (cs336-basics/): the three
layers the 2026 FSDP test builds its model from, written for the companion's tests."""
