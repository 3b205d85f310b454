"""A folder as bytes and back (an uncompressed tar), and a folder's fingerprint: how a model or checkpoint
folder crosses to a node that cannot see it, and how a node tells that it sees the same folder."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path


def fingerprint(folder: str) -> str | None:
    """Names and sizes of a folder's files and the hash of its config.json; None when it is not there."""
    root = Path(folder)
    if not root.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(root)}:{f.stat().st_size}\n".encode())
    config = root / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    return h.hexdigest()


def pack(folder: str) -> bytes:
    """A folder as an uncompressed tar (weights do not compress)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(folder, arcname=".")
    return buf.getvalue()


def unpack(data: bytes, dest: str) -> str:
    """Unpack a tar from ``pack`` into dest (atomically: a temp folder renamed into place); returns dest."""
    target = Path(dest)
    if target.is_dir():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(tmp, filter="data")
    try:
        os.rename(tmp, target)
    except OSError:  # another process unpacked it first

        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def unpack_into(data: bytes, dest: str) -> None:
    """Unpack a tar from ``pack`` into an existing folder, merging with what is there."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(dest, filter="data")
