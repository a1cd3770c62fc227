"""A plain torch.multiprocessing.spawn training script (not helpers.launch) that ends with barrier and
destroy_process_group exits cleanly after training through our DDP wrappers, also when a model was wrapped twice
(as a re-run notebook cell or an earlier test leaves it): no 'terminate called without an active exception'."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNS = 3  # per wrapper here; run the script by hand in a loop for a longer check

SCRIPT = textwrap.dedent("""
    import os, socket, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    import helpers
    from helpers import ddp as D
    from helpers.experiments.common import TiedToyModel, make_batches, rank_share, train_step

    def worker(rank, world, port, kind):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.manual_seed(rank)
        model = TiedToyModel()
        make = (lambda: D.DDPIndividualParameters(model)) if kind == "per_parameter" else (lambda: D.DDPBucketed(model, 0.001))
        make()  # wrapped twice: the first wrapper's hooks must not fire into the teardown
        ddp = make()
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for batch in make_batches("toy", 3, 8, 6):
            train_step(model, opt, *rank_share(batch, "cpu"), grad_sync=ddp)
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(worker, args=(2, port, sys.argv[1]), nprocs=2)
""")


@pytest.mark.parametrize("kind", ["per_parameter", "bucketed"])
def test_spawned_training_script_exits_cleanly(tmp_path, kind):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    for _ in range(RUNS):
        run = subprocess.run([sys.executable, str(script), kind], cwd=ROOT, capture_output=True, text=True,
                             timeout=180, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert run.returncode == 0 and "terminate called" not in run.stderr, run.stderr[-3000:]
