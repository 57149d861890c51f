"""File helpers every stage shares: reading text and YAML safely, atomic writes, shipped-file lookup."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from mambalaya.errors import MambalayaError, did_you_mean

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
    names = shipped_names(kind)
    raise MambalayaError(f"unknown {kind[:-1]} '{name_or_path}'{did_you_mean(str(name_or_path), names)}: "
                         f"give a file path or one of: {', '.join(names)}")


#: the most values a YAML file may expand to, its aliases expanded (a cascade or a spec has a few hundred;
#: nine aliases of nine aliases nested nine deep, the "billion laughs", would have 10^9)
MAX_YAML_VALUES = 100_000


def read_text(path: str | Path, error: type[MambalayaError], what: str) -> str:
    """A file's UTF-8 text, or ``error`` naming the file and what is wrong with it."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{what} is not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); "
                    f"save it as UTF-8 text", file=str(path)) from None
    except OSError as err:
        raise error(f"cannot read {what}: {err.strerror or err}", file=str(path)) from None


#: libyaml's safe composer where PyYAML has it (ten times faster on a large file), else the pure-Python one
_COMPOSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def compose_yaml(text: str, file: str | None, error: type[MambalayaError]) -> yaml.Node | None:
    """The YAML node tree of ``text`` (safe loader: no tags that run code), or ``error`` with the line: a syntax
    error, nesting too deep to read, or more than :data:`MAX_YAML_VALUES` values once aliases are expanded (the
    loaders walk the tree as expanded, so an alias bomb would hang them)."""
    try:
        root = yaml.compose(text, Loader=_COMPOSER)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        problem = " ".join(str(p) for p in (err.context, err.problem) if p) or str(err).splitlines()[0]
        raise error(f"YAML syntax error: {problem}; fix the YAML at this line", file=file,
                    line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as err:
        raise error(f"YAML syntax error: {str(err).splitlines()[0]}", file=file) from None
    except RecursionError:
        raise error("YAML nested too deeply to read; flatten it", file=file) from None
    if root is not None and expanded_size(root) > MAX_YAML_VALUES:
        raise error(f"this YAML expands to more than {MAX_YAML_VALUES} values (aliases of aliases, or "
                    f"an alias inside its own anchor?); "
                    f"write the values out", file=file, line=root.start_mark.line + 1)
    return root


def load_yaml(text: str, file: str | None, error: type[MambalayaError]) -> Any:
    """``text``'s YAML as Python values (safe loader), composed and checked once by :func:`compose_yaml`."""
    root = compose_yaml(text, file, error)
    if root is None:
        return None
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(root)
    except yaml.YAMLError as err:  # e.g. a !!python tag: the safe loader refuses it
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise error(f"cannot read this YAML: {problem}", file=file) from None
    finally:
        loader.dispose()


def expanded_size(root: yaml.Node) -> int:
    """How many nodes ``root`` has with every alias expanded (capped at ``MAX_YAML_VALUES + 1``; a node holding
    an alias of itself expands without end): linear in the composed nodes, each shared node sized once."""
    too_many = MAX_YAML_VALUES + 1
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # on the walk's current path: meeting one again is a cycle
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            open_.discard(id(node))
            sizes[id(node)] = min(1 + sum(sizes[id(k)] for k in _children(node)), too_many)
        elif id(node) not in sizes:
            if id(node) in open_:
                return too_many
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((k, False) for k in _children(node) if id(k) not in sizes)
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write a file so that a reader never sees it half-written, and a failure leaves no debris."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise MambalayaError(f"cannot write {path}: it is a folder; name a file in it")
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.")
    except OSError as err:
        raise MambalayaError(f"cannot write {path}: {err.strerror}") from None
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as err:  # (a full disk, a folder made meanwhile: no half-written file is left)
        Path(tmp).unlink(missing_ok=True)
        raise MambalayaError(f"cannot write {path}: {err.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
