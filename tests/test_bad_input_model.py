"""A bad model fails fast, with one line (issue 35): sizes out of their bounds before any model is built, weights
beyond a card's HBM (or the machine's memory) from the dimensions alone, every config.json field ringgpt reads
checked for type and range, JSON nested too deep, weights that are not finite or overflow FP16 named by tensor,
and property-based fuzzing of config.json through the checkpoint loader (only ringgpt's own errors escape).

The command-line cases fail before a weight is read (a folder with only a config.json serves), so each takes a
fraction of a second; the loader cases use a checkpoint of a tiny synthetic model."""
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.torch import load_file, save_file
from transformers import GPT2LMHeadModel

from ringgpt.host import cli
from ringgpt.host.compiler import CapacityError, CompileError, compile_model
from ringgpt.host.compiler.dims import preflight
from ringgpt.host.errors import CheckpointError, ModelSpecError
from ringgpt.host.reference import spec
from ringgpt.host.reference.models import load_model, synthetic_config
from ringgpt.host.reference.spec import source_fields
from ringgpt.hw.config import get_config
from ringgpt.hw.errors import RingGPTError

TINY = "synthetic:n_layer=1,n_embd=64,n_head=1,vocab_size=300,n_positions=32"
GOOD = {"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 1, "vocab_size": 300, "n_positions": 32,
        "bos_token_id": 299, "eos_token_id": 299}
"""config.json of TINY (what save_pretrained writes, but for the fields ringgpt does not read)."""


def ringgpt(args: list, cwd: Path) -> subprocess.CompletedProcess:
    """`ringgpt generate ARGS` as a user runs it (the console script beside this Python)."""
    script = Path(sys.executable).parent / "ringgpt"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "ringgpt.host.cli"]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("RINGGPT_DEBUG", None)
    return subprocess.run([*argv, "generate", *args], cwd=cwd, capture_output=True, timeout=60, env=env)


def one_line(result: subprocess.CompletedProcess, phrase: str) -> None:
    """Exit 2, nothing on stdout, and on stderr exactly one line: the error, holding `phrase`."""
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == 2, stderr
    assert result.stdout == b"" and "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and phrase in lines[0], stderr


def in_process(args: list, phrase: str) -> None:
    """one_line for `ringgpt generate ARGS` run in this process (torch is imported once, not per case)."""
    result = CliRunner().invoke(cli.main, ["generate", *args])
    lines = result.stderr.splitlines()
    assert result.exit_code == 2 and result.stdout == "", result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and phrase in lines[0], result.stderr


def config_dir(root: Path, name: str, config: dict | None = None, text: str | None = None) -> Path:
    """A folder holding only a config.json: `text`, else GOOD updated with `config`."""
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(text if text is not None else json.dumps({**GOOD, **(config or {})}))
    return folder


# --- sizes: bounded, and checked against the HBM and the machine's memory before a model is built --------------

SYNTHETIC_CASES = [
    ("n_layer=100000,n_embd=768,n_head=12", [],
     "n_layer = 100000 must be a positive integer: it must be at least 1 and at most 1,024"),
    (f"n_layer={10 ** 22},n_embd=768,n_head=12", [], f"n_layer = {10 ** 22} must be a positive integer"),
    ("n_layer=1,n_embd=65536,n_head=1", [], "n_embd = 65536 must be a positive integer: it must be at least 1 and "
                                            "at most 16,384"),
    ("n_layer=1,n_embd=64,n_head=1,n_positions=100000", [], "n_positions = 100000 must be a positive integer"),
    ("n_layer=1,n_embd=64,n_head=1,vocab_size=2000000", [], "vocab_size = 2000000 must be a positive integer"),
    ("n_layer=24,n_embd=768,n_head=12", ["--config", "sim-small", "--cards", "1"],
     "the weights do not fit card 0's HBM: 419,639,408 bytes for 268,435,456"),
]


@pytest.mark.parametrize("spec_text, options, phrase", SYNTHETIC_CASES)
def test_absurd_sizes_exit_2_before_a_model_is_built(spec_text, options, phrase, tmp_path):
    one_line(ringgpt(["--model", f"synthetic:{spec_text}", *options, "a"], tmp_path), phrase)


def test_preflight_checks_weights_and_kv_caches_against_the_hbm():
    fields = source_fields("synthetic:n_layer=1000,n_embd=4096,n_head=32", weight_bytes=0)
    with pytest.raises(CapacityError, match=r"the weights do not fit card 0's HBM: 101,386,502,304 bytes"):
        preflight(fields, get_config("u280", 4), 1024)
    fields = source_fields("synthetic:n_layer=300,n_embd=1024,n_head=16")
    with pytest.raises(CapacityError, match=r"the KV cache for max_context=1024 \(1,258,291,200 bytes\) does not "
                                            r"fit card 0's HBM"):
        preflight(fields, get_config("u280", 1), 1024)
    preflight(fields, get_config("u280", 1), 512)


def test_the_preflight_hbm_map_is_the_compilers():
    """layout.check_hbm lays out what the compiler does (a card without heads included), so the two agree."""
    from ringgpt.host.compiler.layout import check_hbm, plan_buffers
    from ringgpt.host.compiler.partition import partition

    with torch.device("meta"):
        model = GPT2LMHeadModel(synthetic_config("n_layer=3,n_embd=192,n_head=3,vocab_size=100"))
    config = get_config("u280", 4)
    dims = preflight(source_fields("synthetic:n_layer=3,n_embd=192,n_head=3,vocab_size=100"), config, 64)
    part = partition(dims.n_head, dims.n_embd, dims.n_inner, dims.vocab_size, config.cards, config.mpu_lanes)
    kv, plans = plan_buffers(config, dims, part, 64, 2)
    maps = check_hbm(config, dims, part, kv.slot_words, plans, 64)
    assert [m.to_list() for m in maps] == compile_model(model, config, 64).meta["hbm_map"]


def test_weights_beyond_the_machines_memory_are_refused_before_they_are_allocated(monkeypatch):
    monkeypatch.setattr(spec.os, "sysconf", lambda name: {"SC_PHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}[name])
    with pytest.raises(ModelSpecError, match=r"synthetic:n_layer=1,n_embd=64,n_head=1 needs 6,664,192 bytes for "
                                             r"its weights at 2 bytes each, more than this machine's memory "
                                             r"\(4,096,000 bytes\)"):
        source_fields("synthetic:n_layer=1,n_embd=64,n_head=1")
    with pytest.raises(ModelSpecError, match="at 4 bytes each"):
        load_model("synthetic:n_layer=1,n_embd=64,n_head=1")


def test_parameter_count_is_the_models():
    with torch.device("meta"):
        model = GPT2LMHeadModel(synthetic_config("n_layer=2,n_embd=48,n_head=3,vocab_size=100"))
    fields = source_fields("synthetic:n_layer=2,n_embd=48,n_head=3,vocab_size=100")
    assert spec.parameter_count(fields) == sum(p.numel() for p in model.parameters())


# --- config.json: every field ringgpt reads, typed and in range -------------------------------------------------

CONFIG_CASES = [
    ({"eos_token_id": -5}, "eos_token_id = -5 must be a token id, an integer from 0 to 299 (the vocabulary), or null"),
    ({"bos_token_id": 300}, "bos_token_id = 300 must be a token id"),
    ({"eos_token_id": [1, 2]}, "eos_token_id = [1, 2] must be a token id"),
    ({"n_layer": "12"}, "n_layer = '12' must be a positive integer: it must be at least 1 and at most 1,024"),
    ({"n_layer": 10 ** 22}, f"n_layer = {10 ** 22} must be a positive integer"),
    ({"num_hidden_layers": 2000, "n_layer": None}, "n_layer = 2000 must be a positive integer"),
    ({"n_head": True}, "n_head = True must be a positive integer: it must be at least 1 and at most 1,024"),
    ({"n_inner": "x"}, "n_inner = 'x' must be a positive integer: it must be at least 1 and at most 65,536"),
    ({"n_inner": 0}, "n_inner = 0 must be a positive integer"),
    ({"layer_norm_epsilon": -1e-5}, "layer_norm_epsilon = -1e-05 must be a number greater than 0 and at most 1"),
    ({"layer_norm_epsilon": float("nan")}, "layer_norm_epsilon = nan must be a number greater than 0"),
    ({"layer_norm_epsilon": float("inf")}, "layer_norm_epsilon = inf must be a number greater than 0"),
    ({"layer_norm_epsilon": 10 ** 400}, "layer_norm_epsilon = 100000000000000000...0000000000000000000 must be a"),
    ({"layer_norm_epsilon": "1e-5"}, "layer_norm_epsilon = '1e-5' must be a number greater than 0"),
    ({"activation_function": "relu"}, "activation_function = 'relu' is not supported: ringgpt computes GPT-2's GELU"),
    ({"activation_function": 5}, "activation_function = 5 is not supported"),
    ({"scale_attn_weights": "yes"}, "scale_attn_weights = 'yes' must be true or false"),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings = 1 must be true or false"),
    ({"n_layer": [[[[[["deep"]]]]]]}, "n_layer = [[[...]]] must be a positive integer"),
    ({"num_hidden_layers": 1}, "gives num_hidden_layers and n_layer, one field under two names"),
]


@pytest.mark.parametrize("change, phrase, backend", [(c, p, "reference" if i % 3 == 0 else "sim")
                                                     for i, (c, p) in enumerate(CONFIG_CASES)],
                         ids=[str(i) for i in range(len(CONFIG_CASES))])
def test_config_json_fields_are_checked_before_a_weight_is_read(change, phrase, backend, tmp_path):
    config = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    folder = config_dir(tmp_path, "ckpt", text=json.dumps(config))
    in_process(["--model", str(folder), "--backend", backend, "a"], phrase)


@pytest.mark.parametrize("text, phrase", [
    ('{"model_type": "gpt2", "n_layer": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "config.json is not valid JSON (maximum recursion depth exceeded"),
    ('{"model_type": "gpt2", "n_layer": ' + "9" * 5000 + "}", "config.json is not valid JSON (Exceeds the limit"),
    ("[" * 100_000, "config.json is not valid JSON"),
])
def test_json_too_deep_or_too_long_is_bad_input(text, phrase, tmp_path):
    one_line(ringgpt(["--model", str(config_dir(tmp_path, "ckpt", text=text)), "a"], tmp_path), phrase)


def test_an_integer_epsilon_is_taken_as_a_float(tmp_path):
    eps = spec.read_config_json(config_dir(tmp_path, "ckpt", {"layer_norm_epsilon": 1}))["layer_norm_epsilon"]
    assert isinstance(eps, float) and eps == 1.0


# --- weights: finite, and within FP16 where they are stored in it -----------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    return load_model(TINY)


@pytest.fixture(scope="module")
def checkpoint(tiny, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny") / "ckpt"
    tiny.save_pretrained(folder)
    return folder


def with_weight(checkpoint: Path, root: Path, name: str, value: float) -> Path:
    """A copy of `checkpoint` whose tensor `name` holds `value` at one place."""
    folder = root / "changed"
    shutil.copytree(checkpoint, folder)
    state = load_file(folder / "model.safetensors")
    state[name] = state[name].clone()
    state[name].view(-1)[5] = value
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("value, backend", [(math.nan, "reference"), (math.inf, "reference"), (-math.inf, "sim")])
def test_non_finite_weights_are_named_at_load(value, backend, checkpoint, tmp_path):
    folder = with_weight(checkpoint, tmp_path, "transformer.h.0.mlp.c_fc.weight", value)
    in_process(["--model", str(folder), "--backend", backend, "--max-new-tokens", "2", "a"],
               f"tensor transformer.h.0.mlp.c_fc.weight of checkpoint {folder} holds NaN or infinite values")


def test_weights_beyond_fp16_are_named_where_they_would_be_fp16(checkpoint, tmp_path):
    folder = with_weight(checkpoint, tmp_path, "transformer.h.0.attn.c_proj.weight", 1e6)
    phrase = "tensor transformer.h.0.attn.c_proj.weight of {} holds values up to 1e+06 in magnitude, beyond FP16's " \
             "range of +-65504"
    in_process(["--model", str(folder), "--backend", "reference", "--dtype", "fp16", "--max-new-tokens", "2", "a"],
               phrase.format(f"checkpoint {folder}"))
    model = load_model(str(folder))
    with pytest.raises(CompileError, match=phrase.format(f"model '{folder}'").replace("+", r"\+")):
        compile_model(model, get_config("u280", 1), 32)


def test_outputs_are_named_whatever_config_json_prefers(checkpoint, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "return_dict": False}))
    assert load_model(str(folder))(torch.tensor([[1, 2]])).logits.shape == (1, 2, 300)


def test_the_compiler_refuses_an_eos_its_image_loader_would_not_take(tiny):
    tiny.config.eos_token_id = -5
    try:
        with pytest.raises(CompileError, match="the model's eos_token_id = -5 must be a token id"):
            compile_model(tiny, get_config("u280", 1), 32)
    finally:
        tiny.config.eos_token_id = 299


# --- fuzzing config.json through the checkpoint loader ----------------------------------------------------------

FIELDS = [*GOOD, "n_inner", "layer_norm_epsilon", "activation_function", "scale_attn_weights",
          "scale_attn_by_inverse_layer_idx", "tie_word_embeddings", "hidden_size", "num_hidden_layers",
          "num_attention_heads", "max_position_embeddings", "add_cross_attention", "dtype", "torch_dtype",
          "id2label", "label2id", "num_labels", "architectures", "pad_token_id", "resid_pdrop", "initializer_range",
          "reorder_and_upcast_attn", "use_cache", "n_ctx", "transformers_version", "summary_type", "x"]
VALUES = st.recursive(st.none() | st.booleans() | st.integers(-3, 70) | st.sampled_from([299, 1024, 2 ** 70])
                      | st.floats() | st.text(max_size=6) | st.sampled_from(["gelu_new", "float16", "relu", "gpt2"]),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                  max_size=3),
                      max_leaves=5)


def _edited(changes: list) -> str:
    config = dict(GOOD)
    for key, value in changes:
        if value == "<delete>":
            config.pop(key, None)
        else:
            config[key] = value
    return json.dumps(config)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.lists(st.tuples(st.sampled_from(FIELDS), VALUES | st.just("<delete>")), min_size=1, max_size=3).map(_edited),
    st.integers(0, 3000).map(lambda depth: '{"model_type": "gpt2", "n_layer": 1, "x": ' + "[" * depth + "]" * depth
                             + "}"),
    st.text(max_size=40),
))
def test_fuzz_config_json_raises_only_ringgpt_errors(checkpoint, tmp_path_factory, text):
    folder = tmp_path_factory.mktemp("fuzz")
    shutil.copy(checkpoint / "model.safetensors", folder)
    (folder / "config.json").write_text(text)
    try:
        source_fields(str(folder))
        model = load_model(str(folder))
    except RingGPTError:
        return
    assert model.config.n_layer == 1 and model.config.vocab_size == 300


def test_a_field_the_models_modules_refuse_is_a_checkpoint_error(checkpoint, tmp_path):
    """transformers takes resid_pdrop = -1 into the config and refuses it only when it builds the Dropout (the fuzz
    test above found it: a ValueError, not a RingGPTError, before)."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    shutil.copy(checkpoint / "model.safetensors", folder)
    (folder / "config.json").write_text(_edited([("resid_pdrop", -1)]))
    with pytest.raises(CheckpointError, match=r"config.json has a field transformers refuses \(dropout probability"):
        load_model(str(folder))
