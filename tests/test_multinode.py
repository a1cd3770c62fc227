"""Two nodes simulated on this machine: two torchrun agents (--nnodes 2), one process each, c10d rendezvous on a free
loopback port; the benchmark's rows are checked and its provenance says the nodes were simulated on one host."""
import json
import socket
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_nodes(args: list[str], cwd: Path, timeout_s: float = 300) -> list[subprocess.CompletedProcess]:
    """Start one torchrun agent per node rank with `python -m helpers ARGS`; both are killed if either fails or hangs."""
    port, run_id = _free_port(), uuid.uuid4().hex[:8]
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(r),
                                "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", run_id,
                                "--rdzv-endpoint", f"127.0.0.1:{port}", "-m", "helpers", *args],
                               cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for r in range(2)]
    try:
        outs = [a.communicate(timeout=timeout_s) for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.communicate()
    return [subprocess.CompletedProcess(a.args, a.returncode, out, err) for a, (out, err) in zip(agents, outs)]


def test_collectives_on_two_simulated_nodes(tmp_path):
    runs = run_two_nodes(["bench", "collectives", "--profile", "cpu", "--sizes", "4096B", "65536B",
                          "--ops", "all_reduce", "--out", str(tmp_path)], cwd=ROOT)
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "collectives.jsonl").read_text().splitlines()]
    provenance, rows = lines[0]["provenance"], lines[1:]
    assert provenance["topology"] == "2 node(s) simulated on 1 host(s)"
    assert [r["size_bytes"] for r in rows] == [4096, 65536]
    assert all(r["nodes"] == 2 and r["world_size"] == 2 and r["wrong"] == 0 and r["time_s"] > 0 for r in rows)
