"""benchmarks/gpu.py (issue 31) keeps working where no GPU is: --smoke runs every code path that needs no CUDA at
tiny sizes and writes the same JSON layout; without --smoke on a machine with no GPU it refuses, saying why."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_smoke_run_writes_every_section(tmp_path):
    out = tmp_path / "gpu.json"
    result = subprocess.run([sys.executable, "gpu.py", "--smoke", "--out", str(out)], cwd=BENCHMARKS,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    payload = json.loads(out.read_text())
    assert payload["errors"] == {} and payload["smoke"] is True
    assert payload["ceilings"]["copy_bandwidth_bytes_per_s"] > 0
    assert payload["correctness"]["max_abs_logit_difference_float32"] < 1e-4
    levers = payload["training"]["levers"]
    assert len(levers) == 7 and all(row["tokens_per_s"] > 0 for row in levers.values())
    assert payload["training"]["peers"]["Hugging Face eager"]["tokens_per_s"] > 0
    assert payload["pretraining_command"]["eager"]["final_loss"] > 0
    for block in payload["decoding"].values():
        assert all(row["tokens_equal_to_course_eager"] for row in block["variants"].values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark would run")
def test_without_a_gpu_the_benchmark_refuses_and_says_why():
    result = subprocess.run([sys.executable, "gpu.py"], cwd=BENCHMARKS, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "found none" in result.stderr and "--smoke" in result.stderr
