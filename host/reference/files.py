"""Reading and writing files safely: what parsing bad JSON raises, and atomic writes (write to a temporary name in the
target folder, rename into place only on success)."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

JSON_ERRORS = (ValueError, RecursionError)
"""What json.loads raises on text that is not JSON it can read: JSONDecodeError and UnicodeDecodeError (both
ValueErrors), ValueError for an integer of over 4,300 digits, RecursionError for arrays or objects nested too
deep."""


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yields a temporary path next to `path`; on normal exit it replaces `path`, on an exception it is deleted."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
