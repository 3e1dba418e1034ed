"""The bundled default model: GPT-2 architecture and vocabulary, <= 25 MB of FP16 safetensors, and
next-token distributions that are peaked on Python source (it was trained, it is not noise)."""
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import GPT2LMHeadModel

from ringgpt.host.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "host" / "data" / "models" / "bundled"

# Not from the standard library: a held-out snippet in its style (indented with tabs, like the corpus).
SNIPPET = '''def read_config(path, default=None):
	"""Return the parsed JSON object stored at path, or default if the file does not exist."""
	import json
	import os
	if not os.path.exists(path):
		return default
	with open(path, encoding="utf-8") as f:
		return json.load(f)


class Counter:
	def __init__(self):
		self.count = 0

	def increment(self, n=1):
		self.count += n
		return self.count
'''
PROMPTS = ["import os\nimport sys\n", "def __init__(self", "\treturn self.", "if __name__ == '__main__':\n"]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def model():
    m = GPT2LMHeadModel.from_pretrained(BUNDLED, dtype=torch.float32)
    m.eval()
    return m


def test_files_exist():
    for name in ("config.json", "model.safetensors", "TRAINING.json"):
        assert (BUNDLED / name).is_file(), name


def test_config_is_gpt2_with_head_size_64():
    cfg = json.loads((BUNDLED / "config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"]
    assert cfg["vocab_size"] == 50257 and cfg["n_positions"] == 1024
    assert cfg["n_embd"] == 64 * cfg["n_head"]


def test_safetensors_is_fp16_tied_and_at_most_25_mb():
    path = BUNDLED / "model.safetensors"
    assert path.stat().st_size <= 25_000_000
    with safe_open(path, "pt") as f:
        keys = list(f.keys())
        assert all(f.get_slice(k).get_dtype() == "F16" for k in keys)
    assert not any(k.startswith("lm_head") for k in keys), "lm_head is tied to wte and stored once"


def test_training_record_matches_files():
    facts = json.loads((BUNDLED / "TRAINING.json").read_text())
    assert facts["safetensors_bytes"] == (BUNDLED / "model.safetensors").stat().st_size
    assert facts["command"].startswith("python scripts/train_bundled_model.py --steps ")
    assert facts["final_val_loss"] < 5


def test_next_token_distribution_is_peaked(model, tok):
    top = []
    with torch.no_grad():
        for prompt in PROMPTS:
            probs = model(torch.tensor([tok.encode(prompt)])).logits[0, -1].softmax(-1)
            top.append(probs.max().item())
    assert sum(top) / len(top) > 0.2  # uniform would be 1/50257


def test_held_out_snippet_loss_is_low(model, tok):
    ids = torch.tensor([tok.encode(SNIPPET)])
    with torch.no_grad():
        loss = model(ids, labels=ids).loss.item()
    assert loss < 5 < math.log(50257)


def test_greedy_continuation_is_deterministic(model, tok):
    ids = torch.tensor([tok.encode("import ")])

    def greedy():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                              do_sample=False, pad_token_id=50256)[0].tolist()

    first = greedy()
    assert first == greedy() and len(first) == ids.shape[1] + 8
