"""What a model source names, read without torch or transformers: the GPT-2 sizes, synthetic specs and a
checkpoint's config.json, as plain dicts of GPT2Config fields. The command line checks a request against these
before it loads any weights; ringgpt.host.reference.models builds the models from the same dicts."""
from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from ringgpt.host.errors import CheckpointError, ModelSpecError

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
                 "bos_token_id": DEFAULT_EOS, "eos_token_id": DEFAULT_EOS}
"""GPT2Config's defaults for the fields ringgpt reads."""
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
        if fields[key] < 1:
            raise ModelSpecError(f"{key}={fields[key]} in synthetic spec {spec!r} must be at least 1")
    missing = [k for k in REQUIRED_SPEC_KEYS if k not in fields]
    if missing:
        raise ModelSpecError(f"synthetic spec {spec!r} lacks {', '.join(missing)}: give n_layer, n_embd and n_head")
    if fields["n_embd"] % fields["n_head"]:
        raise ModelSpecError(f"n_embd={fields['n_embd']} is not a multiple of n_head={fields['n_head']} in {spec!r}")
    fields.setdefault("vocab_size", VOCAB_SIZE)
    fields.setdefault("n_positions", N_POSITIONS)
    eos = min(DEFAULT_EOS, fields["vocab_size"] - 1)
    return {"bos_token_id": eos, "eos_token_id": eos, **fields}


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
    """The config.json of a GPT-2 checkpoint directory, as a dict (checked: JSON object, model_type 'gpt2',
    positive sizes)."""
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory} has no config.json: a Hugging Face GPT-2 checkpoint directory holds "
                              "config.json and model.safetensors (or pytorch_model.bin)")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}): restore the checkpoint's config.json") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path} ({exc.strerror}): check its permissions") from None
    if not isinstance(data, dict) or data.get("model_type") != "gpt2":
        kind = data.get("model_type") if isinstance(data, dict) else None
        raise CheckpointError(f"{path} describes model_type {kind!r}, not 'gpt2': ringgpt runs GPT-2 checkpoints only")
    fields = model_fields(data)
    for key in SPEC_KEYS:
        value = fields[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise CheckpointError(f"{path}: {key} = {value!r} must be a positive integer: restore the checkpoint's "
                                  "config.json")
    if fields["n_embd"] % fields["n_head"]:
        raise CheckpointError(f"{path}: n_embd={fields['n_embd']} is not a multiple of n_head={fields['n_head']}")
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


def source_fields(source: str) -> dict:
    """The GPT2Config fields of the model that `source` names ("bundled", a checkpoint directory, or
    "synthetic:<size or spec>"), read without loading weights; raises ModelSpecError / CheckpointError."""
    if not isinstance(source, str) or not source:
        raise ModelSpecError("--model is empty: pass 'bundled', 'synthetic:<size>' or a checkpoint directory")
    directory = resolve_source(source)
    if directory is None:
        return model_fields(synthetic_fields(source[len(SYNTHETIC_PREFIX):]))
    return model_fields(read_config_json(directory))
