"""The appliance image: what the compiler builds and a device loads — one program per card, the
initial contents of each card's HBM (weights, embeddings, constants), and the host-side layout
(where token ids go, where each card's logits come back). Saved as a directory:
`manifest.json`, `card<N>.prog` (binary programs, see ringgpt.hw.isa.Program) and
`card<N>.hbm.safetensors` (HBM segments).

Writing never destroys what is not ours: an image goes into a new folder, an empty one, or one that holds
only an earlier image (its files are replaced); a folder with anything else in it is refused unless `force`,
and then only the image's own files are written, never a manifest.json of something else. Every file is
written to a temporary sibling and renamed into place, the manifest last, so a kill leaves either the old
image, the new one, or a folder that is plainly not a whole image; temporaries a killed writer left behind
(`.<name>.ringgpt-tmp-<pid>-<hex>`) are removed by the next write into the same folder.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ringgpt.host.errors import OutputError, RingGPTError
from ringgpt.hw.config import ArchConfig, ConfigError
from ringgpt.hw.isa import IllegalInstructionError, Program

IMAGE_FORMAT = "ringgpt-image/1"
MANIFEST = "manifest.json"
_OUR_FILE = re.compile(r"^(manifest\.json|card(\d+)\.prog|card(\d+)\.hbm\.safetensors)$")
_TEMPORARY = re.compile(r"^\..+\.ringgpt-(?:tmp|old)-(\d+)-[0-9a-f]+$")


class ImageError(RingGPTError, ValueError):
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


# --- writing without destroying anything ------------------------------------------------------------

def _temporary_name(name: str, kind: str = "tmp") -> str:
    return f".{name}.ringgpt-{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def clean_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Removes the temporaries (`.<name>.ringgpt-tmp-<pid>-<hex>`, `.<name>.ringgpt-old-...`) that writers which
    are no longer running left in `directory`; returns what it removed. Touches nothing else."""
    removed = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TEMPORARY.match(entry.name)
        if not match or _pid_alive(int(match.group(1))):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry)
        except OSError:
            pass
    return removed


def _entries(path: Path) -> list[str]:
    return [name for name in os.listdir(path) if not _TEMPORARY.match(name)]


def _manifest_is_ours(path: Path) -> bool:
    try:
        return json.loads((path / MANIFEST).read_text()).get("format") == IMAGE_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def holds_only_an_image(path: str | os.PathLike) -> bool:
    """Whether the folder `path` holds nothing but an image's files (a manifest, if there is one, of ours)."""
    path = Path(path)
    names = _entries(path)
    if not all(_OUR_FILE.match(n) for n in names):
        return False
    return MANIFEST not in names or _manifest_is_ours(path)


def check_output_dir(path: str | os.PathLike, *, force: bool = False) -> str:
    """Where an image may be written, checked before any work: returns "new" (the folder does not exist or is
    empty), "image" (it holds only an earlier image) or "folder" (other files too; only with force). Raises
    OutputError naming the path otherwise."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise OutputError(f"--out {path} is a broken symbolic link: remove it or choose another folder")
    if path.exists() and not path.is_dir():
        raise OutputError(f"--out {path} is a file, not a folder: an image is a folder; choose another path")
    if not path.exists():
        ancestor = path.absolute().parent
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise OutputError(f"--out {path}: {ancestor} is a file, not a folder")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise OutputError(f"--out {path}: cannot create it, {ancestor} is not writable")
        return "new"
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"--out {path}: the folder is not writable")
    try:
        names = _entries(path)
    except OSError as exc:
        raise OutputError(f"--out {path}: cannot list the folder ({exc.strerror})") from None
    if not names:
        return "new"
    if holds_only_an_image(path):
        return "image"
    if (path / MANIFEST).exists() and not _manifest_is_ours(path):
        raise OutputError(f"--out {path} holds a {MANIFEST} that is not a ringgpt image's: ringgpt never replaces "
                          "it, even with --force; choose an empty or new folder")
    if not force:
        shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
        raise OutputError(f"--out {path} is not empty and not a ringgpt image ({len(names)} entries: {shown}): "
                          "choose an empty or new folder, or pass --force to add the image's files to it "
                          "(only manifest.json and card<N>.* are written; nothing else is touched)")
    return "folder"


@dataclass
class ApplianceImage:
    config: ArchConfig
    cards: list
    meta: dict = field(default_factory=dict)
    """Model config, weights hash, host layout (token-id and logits locations), limits."""

    def _manifest(self) -> dict:
        return {"format": IMAGE_FORMAT, "config": self.config.to_dict(), "config_hash": self.config.hash,
                "meta": self.meta, "cards": [{"hbm_words": c.hbm_words, "host_words": c.host_words}
                                             for c in self.cards]}

    def _write_files(self, directory: Path, name_of=lambda name: name) -> list[Path]:
        """Writes every file of the image into `directory` under name_of(final name), manifest last; returns the
        paths written (in that order)."""
        from safetensors.numpy import save_file

        written = []
        for index, card in enumerate(self.cards):
            target = directory / name_of(f"card{index}.prog")
            written.append(target)
            target.write_bytes(card.program.to_bytes())
            target = directory / name_of(f"card{index}.hbm.safetensors")
            written.append(target)
            save_file({f"{addr:010d}": np.ascontiguousarray(arr, dtype=np.float16)
                       for addr, arr in card.hbm_segments}, str(target))
        target = directory / name_of(MANIFEST)
        written.append(target)
        target.write_text(json.dumps(self._manifest(), indent=1, sort_keys=True))
        return written

    def save(self, path: str | os.PathLike, *, force: bool = False, keep_existing: bool = False) -> bool:
        """Writes the image folder `path` (see the module's doc: a new or empty folder, or one holding only an
        earlier image; another folder only with `force`, and then only our files). A new folder is written as a
        temporary sibling and renamed into place. With keep_existing, an image that another writer put at
        `path` first is kept and False returned (the cache's use); else True."""
        path = Path(path)
        mode = check_output_dir(path, force=force)
        if mode == "new" and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            clean_stale_temporaries(path.parent)
            tmp = path.parent / _temporary_name(path.name)
            try:
                tmp.mkdir()
                self._write_files(tmp)
                os.rename(tmp, path)
                return True
            except OSError:
                if not path.is_dir():
                    raise
                # another writer created `path` meanwhile
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
            if keep_existing and holds_only_an_image(path):
                return False
            mode = check_output_dir(path, force=force)
        elif keep_existing and mode == "image" and _manifest_is_ours(path):
            return False
        self._replace_files(path, mode)
        return True

    def _replace_files(self, path: Path, mode: str) -> None:
        """Writes our files into the existing folder `path`, each through a temporary sibling: the old manifest
        (ours) goes first, the new one comes last; with mode "image", card files of ours beyond this image's
        cards are removed."""
        clean_stale_temporaries(path)
        temporaries: dict[str, str] = {}

        def name_of(name: str) -> str:
            temporaries[name] = _temporary_name(name)
            return temporaries[name]
        try:
            self._write_files(path, name_of)
            if (path / MANIFEST).exists() and _manifest_is_ours(path):
                (path / MANIFEST).unlink()
            for final, tmp in temporaries.items():
                if final != MANIFEST:
                    os.replace(path / tmp, path / final)
            if mode == "image":
                for name in _entries(path):
                    match = _OUR_FILE.match(name)
                    index = match and (match.group(2) or match.group(3))
                    if index is not None and int(index) >= len(self.cards):
                        (path / name).unlink()
            os.replace(path / temporaries[MANIFEST], path / MANIFEST)
        finally:
            for tmp in temporaries.values():
                try:
                    (path / tmp).unlink()
                except FileNotFoundError:
                    pass

    # --- reading --------------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ApplianceImage":
        """Reads and checks an image folder; anything missing, malformed or inconsistent raises ImageError naming
        the folder and the file or field."""
        path = Path(path)
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise ImageError(f"{path} is not a ringgpt appliance image: {exc}") from None
        if not isinstance(manifest, dict):
            raise ImageError(f"{path}/{MANIFEST} is not a JSON object: the image is damaged, compile it again")
        if manifest.get("format") != IMAGE_FORMAT:
            raise ImageError(f"{path}: image format {manifest.get('format')!r}, expected {IMAGE_FORMAT!r}")

        def bad(what: str, problem: str):
            raise ImageError(f"{path}/{MANIFEST}: {what} {problem}: the image is damaged, compile it again")

        for key, kind in (("config", dict), ("meta", dict), ("cards", list), ("config_hash", str)):
            if not isinstance(manifest.get(key), kind):
                bad(f"'{key}'", "is missing" if key not in manifest else f"is not a {kind.__name__}")
        try:
            config = ArchConfig(**manifest["config"])
        except (TypeError, ConfigError) as exc:
            bad("'config'", f"is not an architecture config ({exc})")
        if manifest["config_hash"] != config.hash:
            bad("'config_hash'", f"{manifest['config_hash']!r} does not match its config (hash {config.hash})")
        if len(manifest["cards"]) != config.cards:
            bad("'cards'", f"lists {len(manifest['cards'])} cards but config {config.name!r} has {config.cards}")
        meta = manifest["meta"]
        problem = meta_problem(meta, config)
        if problem:
            bad("'meta'", problem)
        cards = []
        for index, info in enumerate(manifest["cards"]):
            if not isinstance(info, dict):
                bad(f"cards[{index}]", "is not an object")
            for key in ("hbm_words", "host_words"):
                if not _count(info.get(key)):
                    bad(f"cards[{index}].{key}", f"= {info.get(key)!r} is not a word count")
            if info["hbm_words"] > config.hbm_words:
                bad(f"cards[{index}].hbm_words", f"= {info['hbm_words']} exceeds the card's {config.hbm_words} words")
            cards.append(CardImage(_read_program(path, index, config), _read_segments(path, index, info["hbm_words"]),
                                   info["hbm_words"], info["host_words"]))
        return cls(config, cards, meta)


def _count(value) -> bool:
    """A non-negative int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_program(path: Path, index: int, config: ArchConfig) -> Program:
    file = path / f"card{index}.prog"
    try:
        program = Program.from_bytes(file.read_bytes())
    except OSError as exc:
        raise ImageError(f"{file} is unreadable ({exc.strerror}): the image is damaged, compile it again") from None
    except IllegalInstructionError as exc:
        raise ImageError(f"{file}: {exc}: the image is damaged, compile it again") from None
    if program.config_hash != config.hash:
        raise ImageError(f"{file} was built for config {program.config_name!r} (hash {program.config_hash}), "
                         f"the image's manifest says {config.name!r} (hash {config.hash}): compile it again")
    if (program.card, program.cards) != (index, config.cards):
        raise ImageError(f"{file} is card {program.card} of {program.cards}, expected card {index} of "
                         f"{config.cards}: the image is damaged, compile it again")
    return program


def _read_segments(path: Path, index: int, hbm_words: int) -> list:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    file = path / f"card{index}.hbm.safetensors"
    try:
        segments = load_file(str(file))
    except FileNotFoundError:
        raise ImageError(f"{file} is missing: the image is damaged, compile it again") from None
    except (OSError, SafetensorError, ValueError, TypeError, KeyError) as exc:  # what a damaged file raises
        raise ImageError(f"{file} is unreadable ({type(exc).__name__}: {exc}): the image is damaged, "
                         "compile it again") from None
    out = []
    for key, words in segments.items():
        if not (len(key) == 10 and key.isascii() and key.isdigit()):
            raise ImageError(f"{file}: segment name {key!r} is not a 10-digit word address: compile the image again")
        address = int(key)
        if words.dtype != np.float16 or words.ndim != 1:
            raise ImageError(f"{file}: segment at {address} is {words.dtype} of shape {words.shape}, not a 1-D FP16 "
                             "array: compile the image again")
        if address + words.size > hbm_words:
            raise ImageError(f"{file}: segment [{address}, {address + words.size}) lies outside the card's memory "
                             f"map of {hbm_words} words: compile the image again")
        out.append((address, words))
    return sorted(out, key=lambda item: item[0])


def meta_problem(meta: dict, config: ArchConfig, *, require_runtime: bool = False) -> str | None:
    """What is wrong with an image's meta (None if nothing): the fields the runtime reads must have their types and
    ranges when present (all of them with require_runtime: max_rows, max_context, model.vocab_size, host)."""
    def positive(value) -> bool:
        return _count(value) and value >= 1

    for key in ("max_rows", "max_context"):
        if key in meta and not positive(meta[key]):
            return f"{key} = {meta[key]!r} is not a positive integer"
        if require_runtime and key not in meta:
            return f"lacks {key}"
    model = meta.get("model")
    if model is not None or require_runtime:
        if not isinstance(model, dict) or not positive(model.get("vocab_size")):
            return f"model = {model!r} lacks a positive vocab_size"
    if "eos_token_id" in meta and meta["eos_token_id"] is not None and not _count(meta["eos_token_id"]):
        return f"eos_token_id = {meta['eos_token_id']!r} is not a token id"
    host = meta.get("host")
    if host is None:
        return "lacks the host layout ('host')" if require_runtime else None
    if not isinstance(host, dict) or not _count(host.get("ids_offset")) or not isinstance(host.get("logits"), list):
        return f"host = {host!r} is not a host layout (ids_offset, logits)"
    for entry in host["logits"]:
        if not (isinstance(entry, dict) and _count(entry.get("card")) and entry["card"] < config.cards
                and _count(entry.get("offset")) and isinstance(entry.get("vocab"), list) and len(entry["vocab"]) == 2
                and all(_count(v) for v in entry["vocab"]) and entry["vocab"][0] < entry["vocab"][1]):
            return f"host.logits entry {entry!r} is not (card < {config.cards}, offset, [first, end) of the vocabulary)"
    if not host["logits"]:
        return "host.logits is empty"
    return None
