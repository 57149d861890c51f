"""The package's stages import only earlier stages (the folder listing is the flow): a later stage's name used by
an earlier one is an import cycle waiting to happen (the tile search once sat in ``cost`` and imported back into
it from ``mapper``'s side)."""

from __future__ import annotations

import ast
from pathlib import Path

import mambalaya

#: The flow, first to last (``errors``, ``fileio`` and ``checkpoint`` are the base every stage may use).
STAGES = ("errors", "fileio", "checkpoint", "ir", "parse", "analysis", "arch", "schedule", "cost", "mapper", "exec",
          "report", "study", "cli")
ROOT = Path(mambalaya.__file__).parent


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mambalaya."):
            yield node.lineno, node.module.split(".")[1]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mambalaya."):
                    yield node.lineno, alias.name.split(".")[1]


def test_every_stage_imports_only_earlier_stages() -> None:
    wrong, unknown = [], set()
    for path in sorted(ROOT.rglob("*.py")):
        first = path.relative_to(ROOT).parts[0]
        if first == "__init__.py":
            continue  # (the package's lazy API names every stage)
        stage = first.removesuffix(".py")
        if stage not in STAGES:
            unknown.add(stage)
            continue
        for line, target in _imports(path):
            if target not in STAGES:
                unknown.add(target)
            elif STAGES.index(target) > STAGES.index(stage):
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line}: {stage} imports {target}")
    assert not unknown, f"stages missing from STAGES: {sorted(unknown)}"
    assert not wrong, "\n".join(wrong)
