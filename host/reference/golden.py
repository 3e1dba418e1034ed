"""Golden records: one generation (tokens, logits, optional hidden states) plus everything needed to reproduce it,
in one safetensors file. The format is described in docs/reference.md."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import safetensors
import torch
import transformers
from safetensors.numpy import load_file, save_file
from transformers import GPT2LMHeadModel

from ringgpt.host.errors import GoldenRecordError
from ringgpt.host.reference.files import atomic_path
from ringgpt.host.reference.generate import GenerationResult
from ringgpt.host.reference.models import weights_hash
from ringgpt.host.reference.sampling import SamplingConfig

FORMAT_NAME = "ringgpt-golden"
FORMAT_VERSION = "1"
HIDDEN_PREFIX = "hidden."
METADATA_KEYS = ("format", "format_version", "model_config", "weights_hash", "dtype", "sampling", "model_source",
                 "torch_version", "transformers_version")


@dataclass(frozen=True)
class GoldenRecord:
    """A loaded golden record; model_config is the model's config.json as a dict, sampling the config used."""

    prompt_ids: np.ndarray
    generated_ids: np.ndarray
    logits: np.ndarray
    model_config: dict
    weights_hash: str
    dtype: str
    sampling: SamplingConfig
    model_source: str
    torch_version: str
    transformers_version: str
    hidden_states: dict[int, np.ndarray] = field(default_factory=dict)


def save_golden(path: str | Path, result: GenerationResult, model: GPT2LMHeadModel, cfg: SamplingConfig) -> None:
    """Writes `result` of `model` under `cfg` to `path` atomically (a temporary file renamed into place)."""
    if result.logits is None:
        raise GoldenRecordError("the result has no logits: generate with return_logits=True to save a golden record")
    tensors = {
        "prompt_ids": np.asarray(result.prompt_ids, dtype=np.int64),
        "generated_ids": np.asarray(result.generated_ids, dtype=np.int64),
        "logits": np.ascontiguousarray(result.logits, dtype=np.float32),
    }
    tensors.update({f"{HIDDEN_PREFIX}{layer}": np.ascontiguousarray(h, dtype=np.float32)
                    for layer, h in result.hidden_states.items()})
    metadata = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "model_config": model.config.to_json_string(use_diff=False),
        "weights_hash": weights_hash(model),
        "dtype": str(model.dtype).removeprefix("torch."),
        "sampling": cfg.to_json(),
        "model_source": model.config.name_or_path,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    with atomic_path(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)


def load_golden(path: str | Path) -> GoldenRecord:
    """Reads a golden record; raises GoldenRecordError for a file that is not one or has another format version."""
    path = Path(path)
    if not path.is_file():
        raise GoldenRecordError(f"golden record {path} does not exist")
    try:
        with safetensors.safe_open(str(path), "np") as f:
            metadata = f.metadata() or {}
        tensors = load_file(path)
    except (safetensors.SafetensorError, OSError) as exc:
        raise GoldenRecordError(f"{path} is not a safetensors file ({exc}): it is not a golden record") from None
    if metadata.get("format") != FORMAT_NAME:
        raise GoldenRecordError(f"{path} is not a {FORMAT_NAME} record (format {metadata.get('format')!r})")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise GoldenRecordError(f"{path} has {FORMAT_NAME} format version {metadata.get('format_version')!r}, this "
                                f"ringgpt reads version {FORMAT_VERSION}: regenerate the record with this version")
    missing = [k for k in METADATA_KEYS if k not in metadata] + [
        k for k in ("prompt_ids", "generated_ids", "logits") if k not in tensors]
    if missing:
        raise GoldenRecordError(f"{path} lacks {', '.join(missing)}: the record is incomplete, regenerate it")
    return GoldenRecord(
        prompt_ids=tensors["prompt_ids"], generated_ids=tensors["generated_ids"], logits=tensors["logits"],
        model_config=json.loads(metadata["model_config"]), weights_hash=metadata["weights_hash"],
        dtype=metadata["dtype"], sampling=SamplingConfig.from_json(metadata["sampling"]),
        model_source=metadata["model_source"], torch_version=metadata["torch_version"],
        transformers_version=metadata["transformers_version"],
        hidden_states={int(k[len(HIDDEN_PREFIX):]): v for k, v in tensors.items() if k.startswith(HIDDEN_PREFIX)})
