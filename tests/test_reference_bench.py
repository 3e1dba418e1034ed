"""scripts/bench_reference.py: runs one small cell on CPU and writes its JSON report."""
import json

import pytest
import torch
from click.testing import CliRunner

from ringgpt.host.reference.timing import DYNAMIC, STATIC_COMPILED, device_name


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("bench_reference").main


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_one_cell_on_cpu(bench, tmp_path, keep_threads):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(bench, ["--sizes", "gpt2-124m", "--lengths", "4:3", "--repeats", "1", "--warmup", "0",
                                        "--device", "cpu", "--threads", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["device"] == device_name(torch.device("cpu"))
    assert (report["dtype"], report["torch_threads"]) == ("fp32", 1)
    [cell] = report["cells"]
    assert (cell["size"], cell["variant"], cell["prompt_len"], cell["new_tokens"]) == ("gpt2-124m", DYNAMIC, 4, 3)
    assert f"{STATIC_COMPILED} skipped" in result.output


@pytest.mark.parametrize("args, phrase", [
    (["--lengths", "32x32"], "prompt:output pairs"),
    (["--sizes", "gpt2-huge"], "unknown GPT-2 size"),
])
def test_bad_arguments(bench, tmp_path, args, phrase):
    result = CliRunner().invoke(bench, [*args, "--out", str(tmp_path / "b.json")])
    assert result.exit_code != 0 and phrase in result.output
    assert not (tmp_path / "b.json").exists()
