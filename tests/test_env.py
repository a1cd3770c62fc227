"""Profiles, machine facts, and the Triton interpreter switch."""
import os
import subprocess
import sys

import pytest
import torch

from helpers import env


def test_auto_profile_follows_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert env.resolve_profile("auto") == "cpu"
    assert env.resolve_profile("CPU") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert env.resolve_profile("auto") == "gpu"


def test_bad_profiles_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="unknown PROFILE"):
        env.resolve_profile("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="needs CUDA"):
        env.resolve_profile("gpu")


def test_machine_facts_and_report():
    facts = env.machine_facts()
    assert facts["torch"] == torch.__version__
    assert facts["cpu_count"] >= 1 and facts["gpu_count"] == torch.cuda.device_count()
    keys = [k for k, _ in env.environment_table("cpu")]
    assert {"device", "distributed backends", "triton mode", "profile"} <= set(keys)


def test_import_helpers_turns_on_the_triton_interpreter_without_cuda():
    clean = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "import helpers, os; print(os.environ.get('TRITON_INTERPRET'))"
    out = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ("1" if not torch.cuda.is_available() else "None")


def test_seed_everything_repeats():
    env.seed_everything(3)
    a = torch.rand(4)
    env.seed_everything(3)
    torch.testing.assert_close(a, torch.rand(4))


def test_cpu_flags_is_a_set_of_names():
    flags = env.cpu_flags()
    assert isinstance(flags, set) and all(isinstance(f, str) and " " not in f for f in flags)
