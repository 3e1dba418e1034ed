"""Compiled appliance images cached on disk, keyed by the weights, the architecture config, the context
length and the compiler itself, so a model is compiled once per machine."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ringgpt.host import compiler
from ringgpt.host.compiler import compile_model
from ringgpt.host.image import ApplianceImage, ImageError
from ringgpt.host.reference.models import weights_hash
from ringgpt.hw.config import ArchConfig

CACHE_ENV = "RINGGPT_CACHE_DIR"


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
    path = Path(root or cache_root()) / "images" / image_key(weights_hash(model), config, max_context)
    if (path / "manifest.json").is_file():
        try:
            return ApplianceImage.load(path), True
        except ImageError:
            pass  # a damaged entry is rebuilt below
    image = compile_model(model, config, max_context)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        image.save(path)
    except OSError:
        if not (path / "manifest.json").is_file():  # not another process that wrote it first
            raise
    return image, False
