"""A blob store in a local folder: keys are relative paths, writes are atomic.

A write goes to a temporary file in the same folder, is flushed to disk, then
``os.replace``-d over the key: a reader sees the old bytes or the new ones,
never half a file, and writing the same key twice is harmless.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from postbox_examples.settings import ExampleSettings

KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9][A-Za-z0-9._-]*)*$")


def blob_root(settings: ExampleSettings) -> Path:
    """``blob_dir``, else ``<state_dir>/blobs``, else ``~/.local/state/postbox/blobs``."""
    if settings.blob_dir:
        return Path(settings.blob_dir)
    state = Path(settings.state_dir) if settings.state_dir else Path.home() / ".local" / "state" / "postbox"
    return state / "blobs"


class BlobStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        if not KEY_RE.match(key) or ".." in key.split("/"):
            raise ValueError(f"invalid blob key {key!r}")
        return self.root / key

    def put(self, key: str, data: bytes) -> None:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def get(self, key: str) -> bytes:
        return self.path(key).read_bytes()

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def keys(self, prefix: str = "") -> list[str]:
        """Stored keys under ``prefix`` (a folder), temporary files excluded."""
        base = self.root / prefix if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(
            str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file() and not p.name.startswith(".")
        )
