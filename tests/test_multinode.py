"""Two nodes simulated on this machine: two torchrun agents (--nnodes 2), one process each, c10d rendezvous on a free
loopback port; the benchmark's rows are checked and its provenance says the nodes were simulated on one host. The
collectives benchmark's rehearsal is notebook 03's (collectives_sections.rehearsal_section, run by make test's nbval:
its rows, sizes and topology checked there); this file rehearses the DDP benchmark."""

import json

from helpers.launch import run_simulated_nodes, topology_label


def test_ddp_bench_on_two_simulated_nodes(tmp_path):
    runs = run_simulated_nodes(
        [
            "bench",
            "ddp",
            "--model",
            "small/cpu",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--batch-size",
            "2",
            "--context-length",
            "16",
            "--out",
            str(tmp_path),
        ]
    )
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    assert "identical weights after training: True" in runs[0].stdout and runs[1].stdout == ""  # rank 0 reports
    lines = [json.loads(line) for line in (tmp_path / "ddp_bench.jsonl").read_text().splitlines()]
    provenance, rows = lines[0]["provenance"], lines[1:]
    assert provenance["topology"] == topology_label(2, 1) and provenance["same_weights"]
    assert [r["wrapper"] for r in rows] == ["bucketed", "torch_ddp"] and all(r["world_size"] == 2 for r in rows)


def test_the_topology_label_says_when_nodes_were_simulated():
    assert topology_label(2, 1) == "2 node(s) simulated on 1 host(s)"  # what notebook 03's rehearsal must read
    assert topology_label(2, 2) == topology_label(2, 3) == "2 node(s)"
