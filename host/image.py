"""The appliance image: what the compiler builds and a device loads — one program per card, the
initial contents of each card's HBM (weights, embeddings, constants), and the host-side layout
(where token ids go, where each card's logits come back). Saved as a directory:
`manifest.json`, `card<N>.prog` (binary programs, see ringgpt.hw.program.Program) and
`card<N>.hbm.safetensors` (HBM segments). The manifest proves the image: it lists every card file with its size
and sha256, every card's HBM segments (address, words), and its own digest; `load` checks all of them.

Writing never destroys what is not ours, and a folder is ours only by a manifest of ours: only the files such a
manifest lists (card<N>.prog, card<N>.hbm.safetensors and itself) are ever replaced or removed. An image goes into
a new folder, an empty one, or one that holds only an earlier image; a folder with anything else in it is refused
unless `force`, and even then a file of the new image's names that no manifest of ours lists is not overwritten.
Every file is written under a temporary name of ours (`.<name>.ringgpt-tmp-<pid>-<hex>`, a new folder as a whole
so) and renamed into place; into an existing folder a manifest that lists the old and the new files goes first and
the new manifest last, so a kill leaves the old image, the new one, or a folder that every file of is listed by
the manifest there (which the next write accepts and `load` refuses). Temporaries a killed writer left are removed
by the next write into the same folder. Writers into one folder take turns (an flock on the folder that holds it).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ringgpt.host.errors import OutputError, RingGPTError
from ringgpt.hw.config import ArchConfig, ConfigError
from ringgpt.hw.isa import IllegalInstructionError
from ringgpt.hw.program import Program

IMAGE_FORMAT = "ringgpt-image/2"
EARLIER_FORMATS = ("ringgpt-image/1",)
"""Image formats an earlier ringgpt wrote (no file digests): their files are ours to replace, but they do not load."""
MANIFEST = "manifest.json"
_CARD_FILE = re.compile(r"^card(\d+)\.(?:prog|hbm\.safetensors)$")
_TEMPORARY = re.compile(r"^\..+\.ringgpt-(?:tmp|old)-(\d+)-[0-9a-f]+$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


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


def _card_files(cards: int) -> list[str]:
    return [name for index in range(cards) for name in (f"card{index}.prog", f"card{index}.hbm.safetensors")]


def _claimed_files(path: Path) -> set[str] | None:
    """The files that a ringgpt manifest in the folder `path` lists, itself included; None when the folder holds
    no manifest of ours. Only card-file names count, so no manifest can claim anything else."""
    try:
        manifest = json.loads(_read_regular(path / MANIFEST))
    except (ImageError, ValueError, RecursionError):
        return None
    if not isinstance(manifest, dict):
        return None
    if manifest.get("format") in EARLIER_FORMATS and isinstance(manifest.get("cards"), list):
        names = _card_files(len(manifest["cards"]))
    elif manifest.get("format") == IMAGE_FORMAT and isinstance(manifest.get("files"), dict):
        names = manifest["files"]
    else:
        return None
    return {MANIFEST, *(name for name in names if isinstance(name, str) and _CARD_FILE.match(name))}


def check_output_dir(path: str | os.PathLike, *, force: bool = False, cards: int | None = None) -> str:
    """Where an image (of `cards` cards, when given) may be written, checked before any work: returns "new" (the
    folder does not exist or is empty), "image" (everything in it is listed by a manifest of ours) or "folder"
    (other files too; only with force, and only when none of the image's files would overwrite one of them).
    Raises OutputError naming the path otherwise."""
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
    claimed = _claimed_files(path)
    if claimed is None and MANIFEST in names:
        raise OutputError(f"--out {path} holds a {MANIFEST} that is not a ringgpt image's: ringgpt never replaces "
                          "it, even with --force; choose an empty or new folder")
    others = sorted(set(names) - (claimed or set()))
    if not others:
        return "image"
    if not force:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise OutputError(f"--out {path} is not empty and not a ringgpt image ({len(others)} entries no ringgpt "
                          f"manifest lists: {shown}): choose an empty or new folder, or pass --force to add the "
                          "image's files to it (files no ringgpt manifest lists are never replaced or deleted)")
    clash = sorted(set(others) & set(_card_files(cards or 0)))
    if clash:
        raise OutputError(f"--out {path}: {clash[0]} is there and no ringgpt manifest lists it, so it is not ours "
                          "to overwrite, even with --force: move it away or choose another folder")
    return "folder"


@contextmanager
def _writer_lock(path: Path):
    """Holds an exclusive flock on the folder that holds `path` (on the folder itself: no lock file) while one
    writer writes `path`; another ringgpt writer of the same folder waits for it."""
    fd = os.open(path.resolve().parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_new_file(target: Path, data: bytes) -> None:
    """Creates `target` (never an existing file) holding `data`."""
    with open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as file:
        file.write(data)


def _file_entry(data: bytes) -> dict:
    """A card file's entry in the manifest: its size and sha256."""
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _digest(manifest: dict) -> str:
    """sha256 of the manifest's canonical JSON, its own 'digest' left out."""
    body = {key: value for key, value in manifest.items() if key != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class ApplianceImage:
    config: ArchConfig
    cards: list
    meta: dict = field(default_factory=dict)
    """Model config, weights hash, host layout (token-id and logits locations), limits."""

    def _manifest(self, files: dict) -> dict:
        """The manifest of this image whose card files are `files` (name: {bytes, sha256}), with its digest."""
        manifest = json.loads(json.dumps({
            "format": IMAGE_FORMAT, "config": self.config.to_dict(), "config_hash": self.config.hash,
            "meta": self.meta, "files": files,
            "cards": [{"hbm_words": c.hbm_words, "host_words": c.host_words,
                       "segments": sorted([int(address), int(np.size(words))] for address, words in c.hbm_segments)}
                      for c in self.cards]}))
        manifest["digest"] = _digest(manifest)
        return manifest

    def digest(self) -> str:
        """The digest of the manifest `save` would write for this image (its programs, HBM contents, config and
        meta): equal digests, the same image."""
        return self._manifest({name: _file_entry(data) for name, data in self._card_file_bytes()})["digest"]

    def _card_file_bytes(self):
        """(name, contents) of every card file, one at a time."""
        from safetensors.numpy import save

        for index, card in enumerate(self.cards):
            yield f"card{index}.prog", card.program.to_bytes()
            yield f"card{index}.hbm.safetensors", save({f"{addr:010d}": np.ascontiguousarray(arr, dtype=np.float16)
                                                        for addr, arr in card.hbm_segments})

    def _write_files(self, directory: Path, name_of=lambda name: name) -> None:
        """Writes every file of the image into `directory` as new files named name_of(final name), the manifest
        (which records each card file's size and sha256) last."""
        files = {}
        for name, data in self._card_file_bytes():
            _write_new_file(directory / name_of(name), data)
            files[name] = _file_entry(data)
        manifest = self._manifest(files)
        _write_new_file(directory / name_of(MANIFEST), json.dumps(manifest, indent=1, sort_keys=True).encode())

    def save(self, path: str | os.PathLike, *, force: bool = False, keep_existing: bool = False) -> bool:
        """Writes the image folder `path` (see the module's doc: a new or empty folder, or one holding only an
        earlier image; another folder only with `force`, and then only our files). A new folder is written as a
        temporary sibling and renamed into place. With keep_existing, an image that another writer put at
        `path` first is kept and False returned (the cache's use); else True."""
        path = Path(path)
        if check_output_dir(path, force=force, cards=len(self.cards)) == "new":
            path.parent.mkdir(parents=True, exist_ok=True)
        with _writer_lock(path):
            mode = check_output_dir(path, force=force, cards=len(self.cards))
            if keep_existing and mode == "image":
                return False
            if path.exists():
                self._replace_files(path)
            else:
                self._write_new(path)
        return True

    def _write_new(self, path: Path) -> None:
        """Writes the image as a temporary sibling folder of `path` and renames it to `path`."""
        clean_stale_temporaries(path.parent)
        tmp = path.parent / _temporary_name(path.name)
        try:
            tmp.mkdir()
            self._write_files(tmp)
            os.rename(tmp, path)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _replace_files(self, path: Path) -> None:
        """Writes our files into the existing folder `path`: every file first as a temporary, then a manifest that
        lists the old image's files and the new ones, the renames, the removal of the old image's files that the
        new one lacks, and the new manifest last."""
        clean_stale_temporaries(path)
        old = _claimed_files(path) or {MANIFEST}
        temporaries: dict[str, str] = {}

        def name_of(name: str) -> str:
            temporaries[name] = _temporary_name(name)
            return temporaries[name]
        claim = _temporary_name(MANIFEST)
        try:
            self._write_files(path, name_of)
            _write_new_file(path / claim, json.dumps({"format": IMAGE_FORMAT, "writing": True, "files": dict.fromkeys(
                sorted((old | set(temporaries)) - {MANIFEST}))}).encode())
            os.replace(path / claim, path / MANIFEST)
            for final, tmp in temporaries.items():
                if final != MANIFEST:
                    os.replace(path / tmp, path / final)
            for name in sorted(old - set(temporaries)):
                (path / name).unlink(missing_ok=True)
            os.replace(path / temporaries[MANIFEST], path / MANIFEST)
        finally:
            for tmp in [claim, *temporaries.values()]:
                (path / tmp).unlink(missing_ok=True)

    # --- reading --------------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ApplianceImage":
        """Reads and checks an image folder: the manifest (its fields and its digest), every card file against the
        size and sha256 the manifest lists, the programs, the HBM segments against the manifest's list and the
        card's memory map, and the host layout against each card's host buffer. Anything missing, malformed or
        inconsistent raises ImageError naming the folder and the file or field."""
        path = Path(path)
        manifest = _read_manifest(path)
        config = _manifest_config(path, manifest)
        meta = manifest["meta"]
        cards = []
        for index, info in enumerate(manifest["cards"]):
            _check_card_entry(path, manifest, index, info, config)
            cards.append(CardImage(_read_program(path, manifest, index, config),
                                   _read_segments(path, manifest, index, info),
                                   info["hbm_words"], info["host_words"]))
        return cls(config, cards, meta)


def _damaged(path: Path, what: str, problem: str) -> ImageError:
    return ImageError(f"{path}/{MANIFEST}: {what} {problem}: the image is damaged, compile it again")


def _read_manifest(path: Path) -> dict:
    """The manifest of the image folder `path`: a JSON object of the current format, written by a writer that
    finished."""
    try:
        manifest = json.loads(_read_regular(path / MANIFEST))
    except ImageError as exc:
        raise ImageError(f"{path} is not a ringgpt appliance image: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise ImageError(f"{path}/{MANIFEST} is not valid JSON ({type(exc).__name__}): the image is damaged, "
                         "compile it again") from None
    if not isinstance(manifest, dict):
        raise ImageError(f"{path}/{MANIFEST} is not a JSON object: the image is damaged, compile it again")
    if manifest.get("format") in EARLIER_FORMATS:
        raise ImageError(f"{path} is an image of an earlier ringgpt (format {manifest['format']!r}, without file "
                         f"digests): compile it again (python -m ringgpt.host.compiler ... --out {path})")
    if manifest.get("format") != IMAGE_FORMAT:
        raise ImageError(f"{path}: image format {manifest.get('format')!r}, expected {IMAGE_FORMAT!r}")
    if manifest.get("writing"):
        raise ImageError(f"{path} holds an image whose writing was interrupted: compile it again")
    return manifest


def _manifest_config(path: Path, manifest: dict) -> ArchConfig:
    """The architecture config of a manifest whose fields, meta, file list and digest have been checked."""
    for key, kind in (("config", dict), ("meta", dict), ("cards", list), ("config_hash", str), ("files", dict),
                      ("digest", str)):
        if not isinstance(manifest.get(key), kind):
            raise _damaged(path, f"'{key}'", "is missing" if key not in manifest else f"is not a {kind.__name__}")
    try:
        config = ArchConfig(**manifest["config"])
    except (TypeError, ConfigError) as exc:
        raise _damaged(path, "'config'", f"is not an architecture config ({exc})") from None
    if manifest["config_hash"] != config.hash:
        raise _damaged(path, "'config_hash'", f"{manifest['config_hash']!r} does not match its config "
                                              f"(hash {config.hash})")
    if len(manifest["cards"]) != config.cards:
        raise _damaged(path, "'cards'", f"lists {len(manifest['cards'])} cards but config {config.name!r} has "
                                        f"{config.cards}")
    problem = meta_problem(manifest["meta"], config) or _host_layout_problem(manifest)
    if problem:
        raise _damaged(path, "'meta'", problem)
    files = manifest["files"]
    if sorted(files) != sorted(_card_files(config.cards)):
        raise _damaged(path, "'files'", f"lists {sorted(files)}, not the files of {config.cards} card(s)")
    for name, info in files.items():
        if not (isinstance(info, dict) and _count(info.get("bytes")) and isinstance(info.get("sha256"), str)
                and _SHA256.match(info["sha256"])):
            raise _damaged(path, f"files[{name!r}]", f"= {info!r} is not a size and sha256")
    if manifest["digest"] != _digest(manifest):
        raise _damaged(path, "'digest'", "does not match the manifest (it was edited or damaged)")
    return config


def _check_card_entry(path: Path, manifest: dict, index: int, info, config: ArchConfig) -> None:
    """Raises ImageError unless cards[index] is {hbm_words, host_words, segments} within the card's memory."""
    if not isinstance(info, dict):
        raise _damaged(path, f"cards[{index}]", "is not an object")
    for key in ("hbm_words", "host_words"):
        if not _count(info.get(key)):
            raise _damaged(path, f"cards[{index}].{key}", f"= {info.get(key)!r} is not a word count")
    if info["hbm_words"] > config.hbm_words:
        raise _damaged(path, f"cards[{index}].hbm_words", f"= {info['hbm_words']} exceeds the card's "
                                                          f"{config.hbm_words} words")
    segments = info.get("segments")
    if not (isinstance(segments, list) and all(isinstance(s, list) and len(s) == 2 and all(_count(v) for v in s)
                                               for s in segments)):
        raise _damaged(path, f"cards[{index}].segments", "is not a list of [address, words]")


def _count(value) -> bool:
    """A non-negative int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _open_regular(file: Path) -> int:
    """A descriptor of `file` open for reading; ImageError unless it is a regular file (a FIFO is not waited on)."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ImageError(f"{file} is missing: the image is damaged, compile it again") from None
    except OSError as exc:
        raise ImageError(f"{file} is unreadable ({exc.strerror}): the image is damaged, compile it again") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ImageError(f"{file} is not a regular file: the image is damaged, compile it again")
    return fd


def _read_regular(file: Path) -> bytes:
    """The contents of the regular file `file` (ImageError otherwise)."""
    with open(_open_regular(file), "rb") as stream:
        return stream.read()


def _read_listed(path: Path, manifest: dict, name: str) -> bytes:
    """The contents of the card file `name`, checked against the size and sha256 the manifest lists."""
    file, listed = path / name, manifest["files"][name]
    with open(_open_regular(file), "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        if size != listed["bytes"]:
            raise ImageError(f"{file} holds {size} bytes, the manifest lists {listed['bytes']}: the file was changed "
                             "or damaged, compile the image again")
        data = stream.read()
    if hashlib.sha256(data).hexdigest() != listed["sha256"]:
        raise ImageError(f"{file} does not match the sha256 its manifest lists: the file was changed or damaged, "
                         "compile the image again")
    return data


def _read_program(path: Path, manifest: dict, index: int, config: ArchConfig) -> Program:
    file = path / f"card{index}.prog"
    try:
        program = Program.from_bytes(_read_listed(path, manifest, file.name))
    except IllegalInstructionError as exc:
        raise ImageError(f"{file}: {exc}: the image is damaged, compile it again") from None
    if program.config_hash != config.hash:
        raise ImageError(f"{file} was built for config {program.config_name!r} (hash {program.config_hash}), "
                         f"the image's manifest says {config.name!r} (hash {config.hash}): compile it again")
    if (program.card, program.cards) != (index, config.cards):
        raise ImageError(f"{file} is card {program.card} of {program.cards}, expected card {index} of "
                         f"{config.cards}: the image is damaged, compile it again")
    return program


def _read_segments(path: Path, manifest: dict, index: int, info: dict) -> list:
    """Card `index`'s HBM segments: FP16 arrays at 10-digit word addresses, exactly those the manifest lists,
    apart from each other and within the card's memory map."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    file = path / f"card{index}.hbm.safetensors"
    data = _read_listed(path, manifest, file.name)
    try:
        segments = load(data)
    except (OSError, SafetensorError, ValueError, TypeError, KeyError) as exc:  # what a damaged file raises
        raise ImageError(f"{file} is unreadable ({type(exc).__name__}: {exc}): the image is damaged, "
                         "compile it again") from None
    out = []
    for key, words in segments.items():
        if not (len(key) == 10 and key.isascii() and key.isdigit()):
            raise ImageError(f"{file}: segment name {key!r} is not a 10-digit word address: compile the image again")
        if words.dtype != np.float16 or words.ndim != 1:
            raise ImageError(f"{file}: segment at {int(key)} is {words.dtype} of shape {words.shape}, not a 1-D "
                             "FP16 array: compile the image again")
        out.append((int(key), words))
    out.sort(key=lambda item: item[0])
    _check_segment_list(file, [(address, words.size) for address, words in out], info)
    return out


def _check_segment_list(file: Path, found: list, info: dict) -> None:
    """Raises ImageError unless the (address, words) segments `found` in `file` are those the manifest's card entry
    lists, apart from each other and within its memory map."""
    listed = [tuple(segment) for segment in info["segments"]]
    if found != listed:
        missing, extra = sorted(set(listed) - set(found)), sorted(set(found) - set(listed))
        what = f"[address, words] {list(missing[0])} is missing" if missing else (
            f"[address, words] {list(extra[0])} is not listed" if extra else "the manifest lists one twice")
        raise ImageError(f"{file}: its segments differ from the manifest's ({what}): compile the image again")
    end = 0
    for address, size in found:
        if address < end or address + size > info["hbm_words"]:
            raise ImageError(f"{file}: segment [{address}, {address + size}) overlaps the one before it or lies "
                             f"outside the card's memory map of {info['hbm_words']} words: compile the image again")
        end = address + size


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
                and all(_count(v) for v in entry["vocab"]) and entry["vocab"][0] < entry["vocab"][1]
                and ("chunk_max_offset" not in entry
                     or _count(entry["chunk_max_offset"]) and _count(entry.get("chunk")) and entry["chunk"] >= 1)):
            return (f"host.logits entry {entry!r} is not (card < {config.cards}, offset, [first, end) of the "
                    "vocabulary[, chunk_max_offset, chunk])")
    if not host["logits"]:
        return "host.logits is empty"
    return None


def _host_layout_problem(manifest: dict) -> str | None:
    """What of the (well-typed) host layout lies outside a card's host buffer (None if nothing): the token ids on
    every card, each card's logits and its chunk maxima."""
    host, cards = manifest["meta"].get("host"), manifest["cards"]
    words = [c.get("host_words") if isinstance(c, dict) and _count(c.get("host_words")) else 0 for c in cards]
    if host is None:
        return None
    rows = manifest["meta"].get("max_rows", 1)
    if host["ids_offset"] + rows > min(words):
        return (f"host.ids_offset = {host['ids_offset']}: its {rows} token ids end at word "
                f"{host['ids_offset'] + rows}, beyond a card's host buffer of {min(words)} words")
    for entry in host["logits"]:
        count = entry["vocab"][1] - entry["vocab"][0]
        ends = {"offset": entry["offset"] + count}
        if "chunk_max_offset" in entry:
            ends["chunk_max_offset"] = entry["chunk_max_offset"] - (-count // entry["chunk"])
        for key, end in ends.items():
            if end > words[entry["card"]]:
                return (f"host.logits of card {entry['card']}: {key} = {entry[key]} ends at word {end}, beyond the "
                        f"card's host buffer of {words[entry['card']]} words")
    return None
