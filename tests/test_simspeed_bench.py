"""scripts/bench_simspeed.py end to end on a tiny model: both sides measured, wall time the primary ratio."""
import json

import pytest
import torch
from click.testing import CliRunner


def test_simspeed_reports_wall_and_cpu_ratios(load_script):
    bench = load_script("bench_simspeed").main
    threads = torch.get_num_threads()
    try:
        result = CliRunner().invoke(bench, ["--model", "synthetic:n_layer=1,n_embd=32,n_head=2,vocab_size=300,"
                                            "n_positions=64", "--cards", "2", "--prompt", "3", "--tokens", "3",
                                            "--repeats", "2", "--torch-threads", "1"])
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["decode_tokens"], report["repeats"], report["torch_threads"]) == (2, 2, 1)
    for side in ("simulator", "pytorch"):
        assert len(report[f"{side}_ms_per_token_wall_each"]) == 2
    for clock in ("wall", "cpu"):  # tiny runs: the differences may be noise, but the ratios are theirs
        simulator, pytorch = report[f"simulator_ms_per_token_{clock}"], report[f"pytorch_ms_per_token_{clock}"]
        want = pytest.approx(simulator / pytorch, rel=1e-2, abs=2e-3) if pytorch > 0.01 else report[f"ratio_{clock}"]
        assert report[f"ratio_{clock}"] == want
    assert "load_average_1min" in report
    parts = report["simulator_ms_per_token_wall_by_part"]
    assert set(parts) == {"functional", "cycle_model", "host"} and parts["functional"] > 0 and parts["cycle_model"] > 0
