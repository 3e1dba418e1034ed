"""`python -m ringgpt.host.compiler`: the image it writes is compile_model's, FP16 or INT8 weights (--weights), and
its summary names every card."""
import subprocess
import sys

import pytest
import torch

from ringgpt.host.compiler import compile_model
from ringgpt.host.image import ApplianceImage
from ringgpt.host.reference.models import load_model
from ringgpt.hw.config import get_config

MODEL = "synthetic:n_layer=1,n_embd=128,n_head=2,vocab_size=96"


@pytest.mark.parametrize("weights", ["fp16", "int8"])
def test_the_command_writes_compile_models_image(weights, tmp_path):
    result = subprocess.run([sys.executable, "-m", "ringgpt.host.compiler", "--model", MODEL, "--config", "sim-small",
                             "--cards", "2", "--max-context", "16", "--weights", weights, "--out", "image"],
                            cwd=tmp_path, capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    assert "image written to image" in result.stdout.decode()
    written = ApplianceImage.load(tmp_path / "image")
    expected = compile_model(load_model(MODEL, dtype=torch.float16), get_config("sim-small", 2), 16, weights=weights)
    assert written.meta["weights"] == weights
    assert [c.program.instructions for c in written.cards] == [c.program.instructions for c in expected.cards]
    assert [c.hbm_words for c in written.cards] == [c.hbm_words for c in expected.cards]


def test_int8_weights_take_about_half_the_hbm(tmp_path):
    words = {}
    for weights in ("fp16", "int8"):
        image = compile_model(load_model(MODEL, dtype=torch.float16), get_config("sim-small", 1), 16, weights=weights)
        words[weights] = sum(r["words"] for r in image.meta["hbm_map"][0] if r["kind"] == "weights")
    assert 0.5 < words["int8"] / words["fp16"] < 0.6
