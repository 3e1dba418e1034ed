"""Model loading: named sizes, synthetic weights, Hugging Face checkpoint directories, the weights hash, and every
bad input with its error."""
import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_reference_support import TINY
from transformers import GPT2LMHeadModel

from ringgpt.host.errors import CheckpointError, DeviceUnavailableError, ModelSpecError
from ringgpt.host.reference import models
from ringgpt.host.reference.models import (GPT2_SIZES, HF_ALIASES, load_model, size_config, synthetic_config,
                                           weights_hash)

# Parameter counts of OpenAI's GPT-2 checkpoints (tied embedding counted once).
PUBLISHED_PARAMS = {"gpt2-124m": 124_439_808, "gpt2-355m": 354_823_168, "gpt2-774m": 774_030_080,
                    "gpt2-1.5b": 1_557_611_200}


@pytest.fixture(scope="module")
def tiny():
    return load_model(TINY, seed=7)


@pytest.fixture
def checkpoint(tiny, tmp_path):
    """A Hugging Face checkpoint directory of the tiny model, written by save_pretrained."""
    tiny.save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


@pytest.mark.parametrize("name", GPT2_SIZES)
def test_sizes_have_the_published_parameter_counts(name):
    with torch.device("meta"):
        model = GPT2LMHeadModel(size_config(name))
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED_PARAMS[name]


@pytest.mark.parametrize("alias", HF_ALIASES)
def test_hf_aliases(alias):
    assert size_config(alias).to_dict() == size_config(HF_ALIASES[alias]).to_dict()


def test_synthetic_spec_fields():
    c = synthetic_config("n_layer=3,n_embd=48,n_head=4,n_positions=64,vocab_size=100")
    assert (c.n_layer, c.n_embd, c.n_head, c.n_positions, c.vocab_size, c.eos_token_id) == (3, 48, 4, 64, 100, 99)


def test_synthetic_is_seeded(tiny):
    assert weights_hash(load_model(TINY, seed=7)) == weights_hash(tiny)
    assert weights_hash(load_model(TINY, seed=8)) != weights_hash(tiny)


def test_synthetic_init_follows_gpt2(tiny):
    std = tiny.config.initializer_range
    h = tiny.transformer.h[0]
    assert h.attn.c_attn.weight.std().item() == pytest.approx(std, rel=0.05)
    assert h.mlp.c_proj.weight.std().item() == pytest.approx(std / (2 * tiny.config.n_layer) ** 0.5, rel=0.05)
    assert torch.equal(h.ln_1.weight, torch.ones_like(h.ln_1.weight))
    assert not h.attn.c_attn.bias.any() and not h.ln_1.bias.any()
    assert tiny.lm_head.weight is tiny.transformer.wte.weight


def test_synthetic_fp16_is_the_fp32_model_rounded(tiny):
    half = load_model(TINY, seed=7, dtype=torch.float16)
    for (name, p16), (_, p32) in zip(half.named_parameters(), tiny.named_parameters()):
        assert torch.equal(p16, p32.half()), name


def test_weights_hash_counts_tied_weights_once(tiny):
    digest = hashlib.sha256()
    state = tiny.state_dict()
    for name in sorted(state):
        if name != "lm_head.weight":
            t = state[name].contiguous()
            digest.update(f"{name}\0{tuple(t.shape)}\0{t.dtype}\0".encode() + t.numpy().tobytes())
    assert weights_hash(tiny) == digest.hexdigest()


def test_weights_hash_sees_one_changed_value():
    model = load_model(TINY, seed=7)
    before = weights_hash(model)
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.bias[3] += 1e-6
    assert weights_hash(model) != before


def test_load_safetensors_checkpoint(tiny, checkpoint):
    loaded = load_model(str(checkpoint))
    assert weights_hash(loaded) == weights_hash(tiny)
    assert not loaded.training and loaded.config.name_or_path == str(checkpoint)


def test_load_checkpoint_as_fp16(tiny, checkpoint):
    loaded = load_model(str(checkpoint), dtype=torch.float16)
    assert loaded.dtype == torch.float16
    assert weights_hash(loaded) == weights_hash(load_model(TINY, seed=7, dtype=torch.float16))


def test_load_sharded_checkpoint(tiny, tmp_path):
    tiny.save_pretrained(tmp_path, max_shard_size="1MB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert weights_hash(load_model(str(tmp_path))) == weights_hash(tiny)


def test_load_pytorch_bin_checkpoint(tiny, tmp_path):
    tiny.config.save_pretrained(tmp_path)
    torch.save({k: v for k, v in tiny.state_dict().items() if k != "lm_head.weight"}, tmp_path / "pytorch_model.bin")
    assert weights_hash(load_model(str(tmp_path))) == weights_hash(tiny)


def test_load_legacy_gpt2model_names_with_mask_buffers(tiny, tmp_path):
    """OpenAI's GPT-2 checkpoints name tensors without "transformer." and carry causal-mask buffers."""
    tiny.config.save_pretrained(tmp_path)
    state = {k.removeprefix("transformer."): v for k, v in tiny.state_dict().items() if k != "lm_head.weight"}
    for i in range(tiny.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 8, 8))
    torch.save(state, tmp_path / "pytorch_model.bin")
    assert weights_hash(load_model(str(tmp_path))) == weights_hash(tiny)


@pytest.mark.skipif(not (models.BUNDLED_MODEL_DIR / "model.safetensors").is_file(), reason="bundled model not built yet")
def test_bundled_model_loads():
    model = load_model("bundled")
    assert model.config.model_type == "gpt2" and model.config.vocab_size == models.VOCAB_SIZE


def test_bundled_missing_is_explained(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "BUNDLED_MODEL_DIR", tmp_path)
    with pytest.raises(CheckpointError, match="bundled model is not installed"):
        load_model("bundled")


def test_nonexistent_path(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(str(tmp_path / "nope"))


def test_path_is_a_file(checkpoint):
    with pytest.raises(CheckpointError, match="is a file"):
        load_model(str(checkpoint / "config.json"))


def test_directory_without_config(tmp_path):
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_model(str(tmp_path))


def test_directory_without_weights(checkpoint):
    (checkpoint / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights file"):
        load_model(str(checkpoint))


def test_config_not_json(checkpoint):
    (checkpoint / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_model(str(checkpoint))


def test_config_of_another_architecture(checkpoint):
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(CheckpointError, match="'bert', not 'gpt2'"):
        load_model(str(checkpoint))


@pytest.mark.parametrize("keep", [4, 2000, -100], ids=["no-header-length", "header-cut", "data-cut"])
def test_truncated_safetensors(checkpoint, keep):
    path = checkpoint / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    with pytest.raises(CheckpointError, match="truncated"):
        load_model(str(checkpoint))


def test_corrupt_safetensors_header(checkpoint):
    path = checkpoint / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:40] = b"\xff" * 32
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        load_model(str(checkpoint))


def test_corrupt_pytorch_bin(checkpoint):
    (checkpoint / "model.safetensors").unlink()
    (checkpoint / "pytorch_model.bin").write_bytes(b"this is not a torch pickle" * 10)
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_model(str(checkpoint))


def test_missing_shard(tiny, tmp_path):
    tiny.save_pretrained(tmp_path, max_shard_size="1MB")
    next(tmp_path.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match="shards that are missing"):
        load_model(str(tmp_path))


def test_shape_mismatch_names_tensor_and_shapes(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["n_positions"] = 512
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"transformer\.wpe\.weight has shape \(1024, 64\).*needs \(512, 64\)"):
        load_model(str(checkpoint))


def test_missing_tensor(checkpoint):
    path = checkpoint / "model.safetensors"
    state = load_file(path)
    del state["transformer.h.1.mlp.c_fc.weight"]
    save_file(state, path)
    with pytest.raises(CheckpointError, match=r"lacks 1 tensor\(s\).*transformer\.h\.1\.mlp\.c_fc\.weight"):
        load_model(str(checkpoint))


def test_checkpoint_with_more_layers_than_its_config(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["n_layer"] = 1
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"transformer\.h\.1\..*do not match"):
        load_model(str(checkpoint))


@pytest.mark.parametrize("spec, phrase", [
    ("synthetic:gpt2-huge", "unknown GPT-2 size"),
    ("synthetic:n_layer=2,n_embd=64", "lacks n_head"),
    ("synthetic:n_layer=2,n_embd=64,n_head=2,depth=3", "unknown field 'depth'"),
    ("synthetic:n_layer=two,n_embd=64,n_head=2", "not an integer"),
    ("synthetic:n_layer=0,n_embd=64,n_head=2", "must be at least 1"),
    ("synthetic:n_layer=2,n_embd=64,n_head=3", "not a multiple of n_head"),
])
def test_bad_synthetic_spec(spec, phrase):
    with pytest.raises(ModelSpecError, match=phrase):
        load_model(spec)


def test_unsupported_dtype():
    with pytest.raises(ModelSpecError, match="not supported"):
        load_model(TINY, dtype=torch.bfloat16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_gpu(device):
    with pytest.raises(DeviceUnavailableError, match="no CUDA GPU"):
        load_model(TINY, device=device)


def test_unknown_device():
    with pytest.raises(DeviceUnavailableError, match="unknown device 'tpu'"):
        load_model(TINY, device="tpu")
