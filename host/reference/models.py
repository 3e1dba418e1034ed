"""GPT-2 models for the reference path: the named sizes, loading (bundled model, Hugging Face checkpoint directory,
seeded synthetic weights) with clear errors, and a content hash of the weights."""
from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel

from ringgpt.host.errors import CheckpointError, DeviceUnavailableError, ModelSpecError
from ringgpt.host.reference.files import JSON_ERRORS
from ringgpt.hw.numerics import dequantize_int8, quantize_int8
from ringgpt.host.reference.spec import (BUNDLED_MODEL_DIR, GPT2_SIZES, HF_ALIASES, N_POSITIONS,  # noqa: F401
                                         REQUIRED_SPEC_KEYS, SPEC_KEYS, SYNTHETIC_PREFIX, VOCAB_SIZE, GPT2Size,
                                         bundled_dir, checkpoint_dir, read_config_json, size_fields, source_fields,
                                         synthetic_fields)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
LEGACY_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers of old checkpoints, not weights
FP16_MAX = torch.finfo(torch.float16).max
"""65504: a weight of larger magnitude becomes an infinity in FP16 (the appliance's weights, --dtype fp16)."""


def size_config(name: str) -> GPT2Config:
    """The GPT2Config of a named size ("gpt2-124m" ... or its Hugging Face alias "gpt2" ...)."""
    return GPT2Config(**size_fields(name))


def synthetic_config(spec: str) -> GPT2Config:
    """GPT2Config from the part after "synthetic:": a size name or "n_layer=2,n_embd=128,n_head=2[,n_positions=..,vocab_size=..]"."""
    return GPT2Config(**synthetic_fields(spec))


def resolve_device(device: str) -> torch.device:
    """torch.device for "cpu", "cuda", "cuda:N" or "auto" (CUDA when present, else CPU)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(f"device {device!r} was requested but torch sees no CUDA GPU "
                                         f"(torch {torch.__version__}): use device 'cpu' or 'auto'")
        index = int(device[5:]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise DeviceUnavailableError(f"device {device!r} was requested but only {torch.cuda.device_count()} "
                                         "CUDA GPU(s) are present: use a smaller index")
        return torch.device(device)
    raise DeviceUnavailableError(f"unknown device {device!r}: use cpu, cuda, cuda:N or auto")


def load_model(source: str, *, dtype: torch.dtype = torch.float32, device: str = "cpu",
               seed: int = 0) -> GPT2LMHeadModel:
    """GPT2LMHeadModel in eval mode from "bundled", a checkpoint directory, or "synthetic:<size or spec>" (seeded);
    its config and the memory its weights need are checked first (spec.source_fields), its weights as they are read
    (check_weights)."""
    target = resolve_device(device)
    if dtype not in DTYPES.values():
        raise ModelSpecError(f"dtype {dtype} is not supported: use {' or '.join(map(str, DTYPES.values()))}")
    source_fields(source, torch.finfo(dtype).bits // 8)
    if source.startswith(SYNTHETIC_PREFIX):
        model = _synthetic_model(synthetic_config(source[len(SYNTHETIC_PREFIX):]), dtype, seed)
    elif source == "bundled":
        model = _checkpoint_model(bundled_dir(BUNDLED_MODEL_DIR), dtype)
    else:
        model = _checkpoint_model(Path(source), dtype)
    model.config.name_or_path = source
    return model.to(target).eval()


def check_weights(tensors, origin: str, error: type, fp16: bool) -> None:
    """Raises `error` naming the first of the (name, tensor) pairs that holds a NaN or an infinity, or, when the
    weights are to be FP16 (`fp16`), a value beyond FP16_MAX in magnitude; one min/max pass per tensor."""
    for name, tensor in tensors:
        if not tensor.numel():
            continue
        low, high = (float(v) for v in torch.aminmax(tensor.detach()))
        if not (math.isfinite(low) and math.isfinite(high)):
            raise error(f"tensor {name} of {origin} holds NaN or infinite values: the weights are damaged; use a "
                        "checkpoint whose weights are finite")
        if fp16 and max(-low, high) > FP16_MAX:
            raise error(f"tensor {name} of {origin} holds values up to {max(-low, high):.6g} in magnitude, beyond "
                        f"FP16's range of +-{FP16_MAX:.0f}, in which they would be stored: rescale the model or run it "
                        "in FP32 (--backend reference --dtype fp32)")


def weights_hash(model: torch.nn.Module) -> str:
    """sha256 over the names, shapes, dtypes and bytes of the weights in name order (tied weights counted once)."""
    persistent = model.state_dict().keys()
    tensors = dict(model.named_parameters())
    tensors.update((n, b) for n, b in model.named_buffers() if n in persistent)
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        digest.update(f"{name}\0{tuple(t.shape)}\0{t.dtype}\0".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def int8_model(model: GPT2LMHeadModel) -> GPT2LMHeadModel:
    """A copy of `model` (FP32) whose matrix weights are what the appliance's INT8 weights stand for
    (numerics.quantize_int8, then q x scale): every layer's four linear layers and the LM head, which is untied from
    the token embedding (the embedding stays as it was, as on the appliance). The Q columns are quantised with the
    attention scale folded in, as the compiler quantises them (host/compiler/model.py), then unfolded in FP32."""
    copy = GPT2LMHeadModel(model.config)
    copy.load_state_dict(model.state_dict())
    copy = copy.float().eval()
    d = model.config.n_embd
    q_scale = 1.0 / math.sqrt(d // model.config.n_head)

    def stand_in(weight: torch.Tensor, folded: float | None = None) -> torch.Tensor:
        w = weight.detach().float().clone()
        if folded is not None:
            w[:, :d] *= folded
        w = torch.from_numpy(dequantize_int8(*quantize_int8(w.numpy())))
        if folded is not None:
            w[:, :d] /= folded
        return w

    with torch.no_grad():
        for block in copy.transformer.h:
            block.attn.c_attn.weight.copy_(stand_in(block.attn.c_attn.weight, q_scale))
            for linear in (block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj):
                linear.weight.copy_(stand_in(linear.weight))
        copy.lm_head.weight = torch.nn.Parameter(stand_in(copy.lm_head.weight.T).T.contiguous())
    return copy


def _empty_model(config: GPT2Config) -> GPT2LMHeadModel:
    with torch.device("meta"):
        return GPT2LMHeadModel(config)


def _synthetic_model(config: GPT2Config, dtype: torch.dtype, seed: int) -> GPT2LMHeadModel:
    """GPT-2 initialisation (N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer), LayerNorm 1/0, biases 0),
    drawn tensor by tensor in name order from one seeded generator."""
    model = _empty_model(config).to(dtype)
    model.to_empty(device="cpu")
    model.tie_weights()
    gen = torch.Generator().manual_seed(seed)
    proj_std = config.initializer_range / math.sqrt(2 * config.n_layer)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if ".ln_" in name:
                param.fill_(1.0 if name.endswith(".weight") else 0.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                std = proj_std if name.endswith("c_proj.weight") else config.initializer_range
                param.copy_(torch.empty(param.shape).normal_(0.0, std, generator=gen))
    return model


def _checkpoint_model(directory: Path, dtype: torch.dtype) -> GPT2LMHeadModel:
    directory = checkpoint_dir(directory)
    config = _read_config(directory)
    state = _read_weights(directory)
    try:
        model = _empty_model(config)
    except (ValueError, TypeError) as exc:  # a field the model's modules refuse (a dropout probability outside [0, 1])
        raise _refused(directory, exc) from None
    _check_state(state, model, directory)
    check_weights(state.items(), f"checkpoint {directory}", CheckpointError, dtype == torch.float16)
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False, assign=True)
    model.tie_weights()
    return model


def _read_config(directory: Path) -> GPT2Config:
    """GPT2Config from a checked config.json; the fields ringgpt does not read, transformers checks. Outputs are
    returned as named fields (return_dict), as ringgpt reads them, whatever config.json prefers."""
    data = read_config_json(directory)
    try:
        return GPT2Config.from_dict(data, return_dict=True)
    except Exception as exc:  # whatever transformers raises on a field it cannot take (strict dataclass checks, ...)
        raise _refused(directory, exc) from None


def _refused(directory: Path, exc: Exception) -> CheckpointError:
    first = " ".join(str(exc).split())[:200]
    return CheckpointError(f"{directory / 'config.json'} has a field transformers refuses ({first}): correct "
                           "config.json or restore the checkpoint's")


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    name = next((n for n in WEIGHT_FILES if (directory / n).is_file()), None)
    if name is None:
        raise CheckpointError(f"no weights file in {directory}: expected one of {', '.join(WEIGHT_FILES)}")
    if name.endswith(".index.json"):
        files = _shards(directory / name)
    else:
        files = [directory / name]
    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(_read_safetensors(path) if path.suffix == ".safetensors" else _read_torch(path))
    return {_canonical_name(k): v for k, v in state.items() if not k.endswith(LEGACY_BUFFER_SUFFIXES)}


def _shards(index_path: Path) -> list[Path]:
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
        names = list(dict.fromkeys(weight_map.values()))
    except (*JSON_ERRORS, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{index_path} is not a valid shard index ({exc!r}): restore it from the checkpoint") from None
    paths = [index_path.parent / n for n in names]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise CheckpointError(f"{index_path} lists shards that are missing: {', '.join(missing)}: copy them into "
                              f"{index_path.parent}")
    return paths


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Checks the header against the file size (a clear message for truncated files), then loads."""
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path} is truncated ({size} bytes, less than the 8-byte safetensors header "
                                  "length): download the checkpoint again")
        header_len = int.from_bytes(prefix, "little")
        if 8 + header_len > size:
            raise CheckpointError(f"{path} is corrupt or truncated: its header length {header_len} runs past the end "
                                  f"of the file ({size} bytes): download the checkpoint again")
        try:
            header = json.loads(f.read(header_len))
            data_end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        except (*JSON_ERRORS, KeyError, TypeError, IndexError, AttributeError):
            raise CheckpointError(f"{path} has a corrupt safetensors header: download the checkpoint again") from None
    if 8 + header_len + data_end > size:
        raise CheckpointError(f"{path} is truncated: its tensor data ends at byte {8 + header_len + data_end} but the "
                              f"file has {size} bytes: download the checkpoint again")
    try:
        return load_file(path)
    except SafetensorError as exc:
        raise CheckpointError(f"{path} is corrupt ({exc}): download the checkpoint again") from None


def _read_torch(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        text = str(exc)
        if "Weights only load failed" in text:
            found = re.search(r"(GLOBAL [\w.]+|Unsupported operand \d+|Unsupported global: GLOBAL [\w.]+)", text)
            detail = f" ({found.group(1)})" if found else ""
            raise CheckpointError(f"{path} is a pickle that safe loading refuses{detail}: it holds Python objects "
                                  "besides tensors, or is damaged, and ringgpt never unpickles those (that can run "
                                  "arbitrary code): use the checkpoint's model.safetensors, or a pytorch_model.bin "
                                  "that holds only tensors") from None
        first = text.splitlines()[0].split(". ")[0] if text else ""
        raise CheckpointError(f"cannot read {path}: it is corrupt or truncated ({type(exc).__name__}: {first}): "
                              "download the checkpoint again") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} does not hold a state dict of tensors: it is not a model weights file")
    return state


def _canonical_name(name: str) -> str:
    """Names as GPT2LMHeadModel has them (checkpoints of the bare GPT2Model lack the "transformer." prefix)."""
    return name if name.startswith(("transformer.", "lm_head.")) else f"transformer.{name}"


def _check_state(state: dict[str, torch.Tensor], model: GPT2LMHeadModel, origin: Path) -> None:
    """Drops lm_head.weight when it is tied to the embedding, then checks names, shapes and dtypes against `model`."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        expected.pop("lm_head.weight")
        state.pop("lm_head.weight", None)
    missing = sorted(expected.keys() - state.keys())
    if missing:
        raise CheckpointError(f"checkpoint {origin} lacks {len(missing)} tensor(s) that its config.json needs, "
                              f"e.g. {', '.join(missing[:3])}: the weights file is incomplete or from another model")
    extra = sorted(state.keys() - expected.keys())
    if extra:
        raise CheckpointError(f"checkpoint {origin} has {len(extra)} tensor(s) that a GPT-2 LM with its config.json "
                              f"does not, e.g. {', '.join(extra[:3])}: config.json and the weights do not match")
    c = model.config
    for name in sorted(expected):
        if tuple(state[name].shape) != expected[name]:
            raise CheckpointError(
                f"tensor {name} has shape {tuple(state[name].shape)} in checkpoint {origin} but its config.json "
                f"(n_layer={c.n_layer}, n_embd={c.n_embd}, n_head={c.n_head}, vocab_size={c.vocab_size}, "
                f"n_positions={c.n_positions}) needs {expected[name]}: config.json and the weights do not match")
        if not state[name].is_floating_point():
            raise CheckpointError(f"tensor {name} in checkpoint {origin} has dtype {state[name].dtype}, "
                                  "not a floating-point type: it is not a GPT-2 weights file")
