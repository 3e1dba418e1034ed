"""Compiled appliance images cached on disk, keyed by the weights, the architecture config, the context
length and the compiler itself, so a model is compiled once per machine.

The cache heals itself: an entry that fails to load or check for any reason is named in a CacheRepairWarning,
moved aside to images/<key>.damaged-<n> (kept for a post-mortem, never reused) and rebuilt; temporaries that a
killed writer left behind are removed on the next use."""
from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from pathlib import Path

from ringgpt.host import compiler
from ringgpt.host.compiler import compile_model
from ringgpt.host.image import ApplianceImage, clean_stale_temporaries, meta_problem
from ringgpt.host.reference.models import weights_hash
from ringgpt.hw.config import ArchConfig

CACHE_ENV = "RINGGPT_CACHE_DIR"
DAMAGED_KEPT = 3
"""Damaged entries kept per key (older ones are removed)."""


class CacheRepairWarning(UserWarning):
    """A cached image that could not be used was moved aside and is being rebuilt."""


def cache_root() -> Path:
    """$RINGGPT_CACHE_DIR, else ~/.cache/ringgpt."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "ringgpt")


def compiler_fingerprint() -> str:
    """Hash of the compiler's source: any change to it invalidates cached images."""
    digest = hashlib.sha256()
    for path in sorted(Path(compiler.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def image_key(whash: str, config: ArchConfig, max_context: int) -> str:
    blob = f"{whash}\0{config.hash}\0{max_context}\0{compiler_fingerprint()}".encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def cached_image(model, config: ArchConfig, max_context: int = 1024,
                 root: str | os.PathLike | None = None) -> tuple[ApplianceImage, bool]:
    """(image, whether it came from the cache): the model compiled for `config`, loaded from
    root/images/<key> when there, else compiled and written there atomically."""
    whash = weights_hash(model)
    path = Path(root or cache_root()) / "images" / image_key(whash, config, max_context)
    clean_stale_temporaries(path.parent)
    if path.exists() or path.is_symlink():
        try:
            return _load_entry(path, config, whash, max_context), True
        except Exception as exc:  # noqa: BLE001 - whatever is wrong with an entry, it is set aside and rebuilt
            _set_aside(path, exc)
    image = compile_model(model, config, max_context)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, keep_existing=True)  # another process that wrote the same entry first wins
    return image, False


def _load_entry(path: Path, config: ArchConfig, whash: str, max_context: int) -> ApplianceImage:
    """The cached image at `path`, checked to be the one its key names and complete enough to run."""
    image = ApplianceImage.load(path)
    problem = meta_problem(image.meta, image.config, require_runtime=True)
    if image.config.hash != config.hash:
        problem = f"it was built for config {image.config.name!r}, not {config.name!r}"
    elif image.meta.get("weights_hash") != whash:
        problem = "its weights hash is not the model's"
    elif image.meta.get("max_context") != max_context:
        problem = f"its max_context is {image.meta.get('max_context')!r}, not {max_context}"
    if problem:
        raise ValueError(problem)
    return image


def _set_aside(path: Path, exc: Exception) -> None:
    """Moves the damaged entry `path` to a numbered sibling and warns, naming both."""
    siblings = sorted(path.parent.glob(f"{path.name}.damaged-*"), key=lambda p: p.stat().st_mtime)
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
