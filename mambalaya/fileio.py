"""File helpers every stage shares: atomic writes and shipped-file lookup."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mambalaya.errors import MambalayaError

_REPO = Path(__file__).resolve().parents[1]


def shipped_dir(kind: str) -> Path:
    """The folder of shipped ``cascades`` or ``archs``: the repo's, or the installed package data."""
    for candidate in (_REPO / kind, Path(__file__).resolve().parent / "data" / kind):
        if candidate.is_dir():
            return candidate
    raise MambalayaError(f"cannot find the shipped {kind}/ folder next to the mambalaya package")


def shipped_names(kind: str) -> list[str]:
    return sorted(p.stem for p in shipped_dir(kind).glob("*.yaml"))


def resolve_shipped(name_or_path: str | Path, kind: str) -> Path:
    """A path as given, or the shipped file of that name (``mamba2`` -> ``cascades/mamba2.yaml``)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        if not path.exists():
            raise MambalayaError(f"no such file: {path}")
        return path
    shipped = shipped_dir(kind) / f"{name_or_path}.yaml"
    if shipped.exists():
        return shipped
    names = ", ".join(shipped_names(kind))
    raise MambalayaError(f"unknown {kind[:-1]} '{name_or_path}': give a file path or one of: {names}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write a file so that a reader never sees it half-written, and a failure leaves no debris."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.")
    except OSError as err:
        raise MambalayaError(f"cannot write {path}: {err.strerror}") from None
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
