"""What a model source names, read without torch or transformers: the GPT-2 sizes, synthetic specs and a
checkpoint's config.json, as plain dicts of GPT2Config fields. The command line checks a request against these
before it loads any weights; ringgpt.host.reference.models builds the models from the same dicts."""
from __future__ import annotations

import json
import os
import reprlib
from pathlib import Path
from typing import NamedTuple

from ringgpt.host.errors import CheckpointError, ModelSpecError
from ringgpt.host.reference.files import JSON_ERRORS

VOCAB_SIZE = 50257
N_POSITIONS = 1024
DEFAULT_EOS = 50256
"""GPT2Config's bos/eos token id."""


class GPT2Size(NamedTuple):
    n_layer: int
    n_embd: int
    n_head: int


GPT2_SIZES: dict[str, GPT2Size] = {
    "gpt2-124m": GPT2Size(12, 768, 12),
    "gpt2-355m": GPT2Size(24, 1024, 16),
    "gpt2-774m": GPT2Size(36, 1280, 20),
    "gpt2-1.5b": GPT2Size(48, 1600, 25),
}
HF_ALIASES = {"gpt2": "gpt2-124m", "gpt2-medium": "gpt2-355m", "gpt2-large": "gpt2-774m", "gpt2-xl": "gpt2-1.5b"}

BUNDLED_MODEL_DIR = Path(__file__).resolve().parent.parent / "data" / "models" / "bundled"
SYNTHETIC_PREFIX = "synthetic:"
SPEC_KEYS = ("n_layer", "n_embd", "n_head", "n_positions", "vocab_size")
REQUIRED_SPEC_KEYS = SPEC_KEYS[:3]

GPT2_DEFAULTS = {"model_type": "gpt2", "vocab_size": VOCAB_SIZE, "n_positions": N_POSITIONS, "n_embd": 768,
                 "n_layer": 12, "n_head": 12, "n_inner": None, "activation_function": "gelu_new",
                 "layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                 "bos_token_id": DEFAULT_EOS, "eos_token_id": DEFAULT_EOS, "tie_word_embeddings": True}
"""GPT2Config's defaults for the fields ringgpt reads."""
SIZE_LIMITS = {"n_layer": 1024, "n_embd": 16384, "n_head": 1024, "n_positions": 65536, "vocab_size": 1 << 20,
               "n_inner": 65536}
"""The largest value of each size field (the smallest is 1; n_inner may also be null, 4 n_embd): far beyond GPT-2's
(48 layers, 1,600 wide, 25 heads, 1,024 positions, 50,257 words), and bounded so that no config asks for a model
without bound before its memory is checked."""
SUPPORTED_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")
"""GPT-2's GELU, the tanh approximation (numerics.gelu_tanh): both names denote it, and it is what the appliance
computes."""
FLAGS = ("scale_attn_weights", "scale_attn_by_inverse_layer_idx", "tie_word_embeddings")
_HF_NAMES = {"hidden_size": "n_embd", "max_position_embeddings": "n_positions", "num_attention_heads": "n_head",
             "num_hidden_layers": "n_layer"}


def size_fields(name: str) -> dict:
    """GPT2Config fields of a named size ("gpt2-124m" ... or its Hugging Face alias "gpt2" ...)."""
    size = GPT2_SIZES.get(HF_ALIASES.get(name, name))
    if size is None:
        raise ModelSpecError(f"unknown GPT-2 size {name!r}: use one of {', '.join([*GPT2_SIZES, *HF_ALIASES])}")
    return {"vocab_size": VOCAB_SIZE, "n_positions": N_POSITIONS, **size._asdict()}


def synthetic_fields(spec: str) -> dict:
    """GPT2Config fields from the part after "synthetic:": a size name or
    "n_layer=2,n_embd=128,n_head=2[,n_positions=..,vocab_size=..]"."""
    if "=" not in spec:
        return size_fields(spec)
    fields: dict[str, int] = {}
    for item in spec.split(","):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in SPEC_KEYS:
            raise ModelSpecError(f"unknown field {key!r} in synthetic spec {spec!r}: use {', '.join(SPEC_KEYS)}")
        if key in fields:
            raise ModelSpecError(f"{key} is given twice in synthetic spec {spec!r}")
        try:
            fields[key] = int(value)
        except ValueError:
            raise ModelSpecError(f"{key}={value!r} in synthetic spec {spec!r} is not an integer") from None
    missing = [k for k in REQUIRED_SPEC_KEYS if k not in fields]
    if missing:
        raise ModelSpecError(f"synthetic spec {spec!r} lacks {', '.join(missing)}: give n_layer, n_embd and n_head")
    fields.setdefault("vocab_size", VOCAB_SIZE)
    fields.setdefault("n_positions", N_POSITIONS)
    eos = min(DEFAULT_EOS, fields["vocab_size"] - 1)
    fields = {"bos_token_id": eos, "eos_token_id": eos, **fields}
    problem = fields_problem({**GPT2_DEFAULTS, **fields})
    if problem:
        raise ModelSpecError(f"synthetic spec {spec!r}: {problem}")
    return fields


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 2, 40, 40


def shown(value) -> str:
    """repr(value) cut short (a config.json value may be megabytes long or nested thousands deep)."""
    return _SHOWN.repr(value)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def token_id_problem(key: str, value, vocab_size: int) -> str | None:
    """What is wrong with token id field `key` (None if nothing): it must be null or in the vocabulary."""
    if value is None or (_integer(value) and 0 <= value < vocab_size):
        return None
    return (f"{key} = {shown(value)} must be a token id, an integer from 0 to {vocab_size - 1:,} (the vocabulary), "
            "or null")


def fields_problem(fields: dict) -> str | None:
    """What is wrong with the GPT2Config fields ringgpt reads (model_fields), as one phrase naming the field and
    what it may be, or None: every size an integer in 1..SIZE_LIMITS (n_inner also null), n_embd a multiple of
    n_head, the token ids null or in the vocabulary, layer_norm_epsilon in (0, 1],
    activation_function one of SUPPORTED_ACTIVATIONS, the FLAGS true or false."""
    for key, top in SIZE_LIMITS.items():
        value = fields[key]
        if not (_integer(value) and 1 <= value <= top) and not (key == "n_inner" and value is None):
            return f"{key} = {shown(value)} must be a positive integer: it must be at least 1 and at most {top:,}"
    if fields["n_embd"] % fields["n_head"]:
        return f"n_embd={fields['n_embd']} is not a multiple of n_head={fields['n_head']}"
    for key in ("bos_token_id", "eos_token_id"):
        problem = token_id_problem(key, fields[key], fields["vocab_size"])
        if problem:
            return problem
    eps = fields["layer_norm_epsilon"]
    if not ((_integer(eps) or isinstance(eps, float)) and 0 < eps <= 1):
        return f"layer_norm_epsilon = {shown(eps)} must be a number greater than 0 and at most 1 (GPT-2's is 1e-05)"
    activation = fields["activation_function"]
    if not (isinstance(activation, str) and activation in SUPPORTED_ACTIVATIONS):
        return (f"activation_function = {shown(activation)} is not supported: ringgpt computes GPT-2's GELU, the "
                f"tanh approximation ({' or '.join(SUPPORTED_ACTIVATIONS)})")
    wrong = next((key for key in FLAGS if not isinstance(fields[key], bool)), None)
    return f"{wrong} = {shown(fields[wrong])} must be true or false" if wrong else None


def parameter_count(fields: dict) -> int:
    """The weights of a GPT-2 LM with these GPT2Config fields, its LM head tied to the token embedding."""
    d, inner = fields["n_embd"], fields["n_inner"] or 4 * fields["n_embd"]
    layer = 4 * d + 3 * d * (d + 1) + d * (d + 1) + inner * (d + 1) + d * (inner + 1)  # LayerNorms, QKV, proj, MLP
    return (fields["vocab_size"] + fields["n_positions"]) * d + fields["n_layer"] * layer + 2 * d


def checkpoint_dir(source: str | Path) -> Path:
    """The checkpoint directory `source` names, checked to exist and be a directory."""
    directory = Path(source)
    if not directory.exists():
        raise CheckpointError(f"checkpoint directory {directory} does not exist: pass 'bundled', "
                              "'synthetic:<size>' or the path of a Hugging Face GPT-2 checkpoint directory")
    if not directory.is_dir():
        raise CheckpointError(f"{directory} is a file: pass the directory that holds config.json and the weights")
    return directory


def read_config_json(directory: Path) -> dict:
    """The config.json of a GPT-2 checkpoint directory, as a dict (checked: a JSON object, model_type 'gpt2', each
    field under one name, fields_problem)."""
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory} has no config.json: a Hugging Face GPT-2 checkpoint directory holds "
                              "config.json and model.safetensors (or pytorch_model.bin)")
    try:
        data = json.loads(path.read_bytes())
    except JSON_ERRORS as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}): restore the checkpoint's config.json") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path} ({exc.strerror}): check its permissions") from None
    if not isinstance(data, dict) or data.get("model_type") != "gpt2":
        kind = shown(data.get("model_type")) if isinstance(data, dict) else None
        raise CheckpointError(f"{path} describes model_type {kind}, not 'gpt2': ringgpt runs GPT-2 checkpoints only")
    twice = [f"{alias} and {name}" for alias, name in _HF_NAMES.items() if alias in data and name in data]
    if twice:
        raise CheckpointError(f"{path} gives {twice[0]}, one field under two names: keep one of them")
    problem = fields_problem(model_fields(data))
    if problem:
        raise CheckpointError(f"{path}: {problem}: correct config.json or restore the checkpoint's")
    if _integer(data.get("layer_norm_epsilon")):  # JSON's 1 for 1.0; GPT2Config takes only a float
        data["layer_norm_epsilon"] = float(data["layer_norm_epsilon"])
    return data


def model_fields(config: dict) -> dict:
    """The GPT2Config fields ringgpt reads, from a config dict (Hugging Face aliases and defaults resolved)."""
    fields = dict(GPT2_DEFAULTS)
    for key, value in config.items():
        fields[_HF_NAMES.get(key, key)] = value
    return fields


def resolve_source(source: str) -> Path | None:
    """The checkpoint directory of `source` ("bundled" or a path), or None for a synthetic model."""
    if source.startswith(SYNTHETIC_PREFIX):
        return None
    if source == "bundled":
        return bundled_dir(BUNDLED_MODEL_DIR)
    return checkpoint_dir(source)


def bundled_dir(directory: Path) -> Path:
    """`directory`, checked to hold the bundled model's config.json."""
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"the bundled model is not installed ({directory} has no config.json): "
                              "use 'synthetic:gpt2-124m' for random weights or a Hugging Face GPT-2 checkpoint "
                              "directory")
    return directory


def source_fields(source: str, weight_bytes: int = 2) -> dict:
    """The GPT2Config fields of the model that `source` names ("bundled", a checkpoint directory, or
    "synthetic:<size or spec>"), read without loading weights and checked (fields_problem), its weights at
    `weight_bytes` each (default: FP16's 2, the least any backend holds them in) within this machine's memory;
    raises ModelSpecError / CheckpointError."""
    if not isinstance(source, str) or not source:
        raise ModelSpecError("--model is empty: pass 'bundled', 'synthetic:<size>' or a checkpoint directory")
    directory = resolve_source(source)
    if directory is None:
        fields = model_fields(synthetic_fields(source[len(SYNTHETIC_PREFIX):]))
    else:
        fields = model_fields(read_config_json(directory))
    need, have = parameter_count(fields) * weight_bytes, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need > have:
        raise ModelSpecError(f"{source} needs {need:,} bytes for its weights at {weight_bytes} bytes each, more than "
                             f"this machine's memory ({have:,} bytes): use a smaller model")
    return fields
