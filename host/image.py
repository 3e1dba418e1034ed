"""The appliance image: what the compiler builds and a device loads — one program per card, the
initial contents of each card's HBM (weights, embeddings, constants), and the host-side layout
(where token ids go, where each card's logits come back). Saved as a directory:
`manifest.json`, `card<N>.prog` (binary programs, see ringgpt.hw.isa.Program) and
`card<N>.hbm.safetensors` (HBM segments)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import Program

IMAGE_FORMAT = "ringgpt-image/1"


class ImageError(ValueError):
    """A missing, corrupt or incompatible appliance image."""


@dataclass
class CardImage:
    program: Program
    hbm_segments: list = field(default_factory=list)
    """(word address, FP16 array) pairs: the card's HBM contents at load."""
    hbm_words: int = 0
    """The memory map's size on this card (every address used is below it)."""
    host_words: int = 0
    """Size of the host buffer this card's program reads and writes (FP16 words)."""


@dataclass
class ApplianceImage:
    config: ArchConfig
    cards: list
    meta: dict = field(default_factory=dict)
    """Model config, weights hash, host layout (token-id and logits locations), limits."""

    def save(self, path: str | os.PathLike) -> None:
        """Writes the image directory atomically (a temporary directory renamed into place)."""
        path = Path(path)
        tmp = Path(tempfile.mkdtemp(prefix=".image-", dir=path.parent if path.parent.exists() else None))
        try:
            manifest = {"format": IMAGE_FORMAT, "config": self.config.to_dict(), "config_hash": self.config.hash,
                        "meta": self.meta, "cards": []}
            for index, card in enumerate(self.cards):
                (tmp / f"card{index}.prog").write_bytes(card.program.to_bytes())
                save_file({f"{addr:010d}": np.ascontiguousarray(arr, dtype=np.float16)
                           for addr, arr in card.hbm_segments}, str(tmp / f"card{index}.hbm.safetensors"))
                manifest["cards"].append({"hbm_words": card.hbm_words, "host_words": card.host_words})
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
            if path.exists():
                shutil.rmtree(path)
            tmp.rename(path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ApplianceImage":
        path = Path(path)
        try:
            manifest = json.loads((path / "manifest.json").read_text())
        except (OSError, ValueError) as exc:
            raise ImageError(f"{path} is not a ringgpt appliance image: {exc}") from None
        if manifest.get("format") != IMAGE_FORMAT:
            raise ImageError(f"{path}: image format {manifest.get('format')!r}, expected {IMAGE_FORMAT!r}")
        config = ArchConfig(**manifest["config"])
        cards = []
        for index, info in enumerate(manifest["cards"]):
            try:
                program = Program.from_bytes((path / f"card{index}.prog").read_bytes())
                segments = load_file(str(path / f"card{index}.hbm.safetensors"))
            except Exception as exc:  # noqa: BLE001 - any read or parse failure is a corrupt image
                raise ImageError(f"{path}: card {index} is unreadable: {exc}") from None
            cards.append(CardImage(program, sorted((int(k), v) for k, v in segments.items()),
                                   info["hbm_words"], info["host_words"]))
        return cls(config, cards, manifest["meta"])
