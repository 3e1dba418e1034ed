"""Compiled appliance images cached on disk, keyed by everything a program depends on (the weights, the model's
whole config, the architecture config, the context length and the compiler itself), so a model is compiled once per
machine.

The cache heals itself: an entry that fails to load or check for any reason (ApplianceImage.load proves every file
against the manifest's sizes and digests) is named in a CacheRepairWarning, moved aside to images/<key>.damaged-<n>
(kept for a post-mortem, never reused) and rebuilt; temporaries that a killed writer left behind are removed on the
next use. The cache is optional: where it cannot be used (its root a file, not writable) the image is compiled
for this run alone, with a CacheUnavailableWarning."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path

from ringgpt.host import compiler
from ringgpt.host.compiler import compile_model
from ringgpt.host.errors import OutputError
from ringgpt.host.image import IMAGE_FORMAT, ApplianceImage, ImageError, clean_stale_temporaries, meta_problem
from ringgpt.host.reference.models import weights_hash
from ringgpt.hw import config as hw_config, isa, numerics, resolved
from ringgpt.hw.config import ArchConfig

CACHE_ENV = "RINGGPT_CACHE_DIR"
DAMAGED_KEPT = 3
"""Damaged entries kept per key (older ones are removed)."""


class CacheRepairWarning(UserWarning):
    """A cached image that could not be used was moved aside and is being rebuilt."""


class CacheUnavailableWarning(UserWarning):
    """The image cache cannot be used (its folder is a file or not writable): the image is compiled for this run."""


def cache_root() -> Path:
    """$RINGGPT_CACHE_DIR, else ~/.cache/ringgpt."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "ringgpt")


def compiler_fingerprint() -> str:
    """Hash of what the compiler's output depends on besides its inputs: its own source, the instruction set's,
    resolved.py's, the numerics' (INT8 quantisation) and the architecture config's, and the image format. Any change
    to them invalidates cached images."""
    digest = hashlib.sha256(IMAGE_FORMAT.encode())
    sources = [*sorted(Path(compiler.__file__).parent.glob("*.py")),
               *(Path(module.__file__) for module in (hw_config, isa, numerics, resolved))]
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def model_config(model) -> str:
    """The model's whole config as canonical JSON (sorted keys; Hugging Face's bookkeeping, the fields named _* and
    transformers_version, left out)."""
    fields = {key: value for key, value in model.config.to_dict().items()
              if not key.startswith("_") and key != "transformers_version"}
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)


def image_key(whash: str, model_json: str, config: ArchConfig, max_context: int, weights: str = "fp16") -> str:
    """The cache key of a model (weights hash, model_config JSON) compiled for `config` and max_context, its matrix
    weights in format `weights` (compiler.WEIGHT_FORMATS)."""
    blob = "\0".join([whash, model_json, config.hash, str(max_context), weights, compiler_fingerprint()]).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def cached_image(model, config: ArchConfig, max_context: int = 1024,
                 root: str | os.PathLike | None = None, weights: str = "fp16") -> tuple[ApplianceImage, bool]:
    """(image, whether it came from the cache): the model compiled for `config` with its matrix weights in format
    `weights`, loaded from root/images/<key> when there, else compiled and written there atomically (or only
    compiled, with a CacheUnavailableWarning, where the cache cannot be written)."""
    whash = weights_hash(model)
    images = _images_folder(Path(root or cache_root()))
    if images is None:
        return compile_model(model, config, max_context, weights=weights), False
    path = images / image_key(whash, model_config(model), config, max_context, weights)
    clean_stale_temporaries(images)
    if path.exists() or path.is_symlink():
        try:
            return _load_entry(path, config, whash, max_context, weights), True
        except Exception as exc:  # noqa: BLE001 - whatever is wrong with an entry, it is set aside and rebuilt
            _set_aside(path, exc)
    image = compile_model(model, config, max_context, weights=weights)
    try:
        image.save(path, keep_existing=True)  # another process that wrote the same entry first wins
    except (OSError, OutputError) as exc:
        _unavailable(images, exc)
    return image, False


def _images_folder(root: Path) -> Path | None:
    """root/images, created when missing; None (with a CacheUnavailableWarning) when it cannot be written."""
    images = root / "images"
    try:
        images.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _unavailable(images, exc)
    if not os.access(images, os.W_OK | os.X_OK):
        return _unavailable(images, PermissionError("not writable"))
    return images


def _unavailable(images: Path, exc: Exception) -> None:
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())
    warnings.warn(CacheUnavailableWarning(f"the image cache {images} cannot be used ({reason}): compiling the image "
                                          f"for this run only; set {CACHE_ENV} to a writable folder to cache it"),
                  stacklevel=3)


def _load_entry(path: Path, config: ArchConfig, whash: str, max_context: int, weights: str) -> ApplianceImage:
    """The cached image at `path`, checked to be the one its key names and complete enough to run (ImageError
    otherwise)."""
    image = ApplianceImage.load(path)
    problem = meta_problem(image.meta, image.config, require_runtime=True)
    if image.config.hash != config.hash:
        problem = f"it was built for config {image.config.name!r}, not {config.name!r}"
    elif image.meta.get("weights_hash") != whash:
        problem = "its weights hash is not the model's"
    elif image.meta.get("max_context") != max_context:
        problem = f"its max_context is {image.meta.get('max_context')!r}, not {max_context}"
    elif image.meta.get("weights") != weights:
        problem = f"its weights are {image.meta.get('weights')!r}, not {weights!r}"
    if problem:
        raise ImageError(f"{path}: {problem}")
    return image


def _set_aside(path: Path, exc: Exception) -> None:
    """Moves the damaged entry `path` to a numbered sibling and warns, naming both."""
    siblings = sorted(path.parent.glob(f"{path.name}.damaged-*"), key=lambda p: p.lstat().st_mtime)
    for old in siblings[:max(0, len(siblings) - DAMAGED_KEPT + 1)]:
        _remove(old)
    number = 1 + max((int(p.name.rsplit("-", 1)[1]) for p in siblings if p.name.rsplit("-", 1)[1].isdigit()),
                     default=0)
    aside = path.with_name(f"{path.name}.damaged-{number}")
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())
    try:
        os.rename(path, aside)
        where = f"moved to {aside}"
    except OSError:
        _remove(path)
        where = "removed"
    warnings.warn(CacheRepairWarning(f"the cached image {path} could not be used ({reason}); {where}; "
                                     "compiling it again"), stacklevel=3)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except OSError:
            pass
