"""What the repository says cites public sources: no file names the project's private brief (its design and
reference notes live outside the repository; a reader cannot open them)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRIVATE = ("DESIGN" + ".md", "REFERENCE" + ".md", "DESIGN" + "-NEXT", "DESIGN" + " section")
WHERE = ("README.md", "mambalaya", "docs", "archs", "cascades", "benchmarks", "notebooks", "scripts", "tests")


def test_no_file_cites_the_private_brief() -> None:
    cited = []
    for top in WHERE:
        paths = [ROOT / top] if (ROOT / top).is_file() else sorted((ROOT / top).rglob("*"))
        for p in paths:
            if not p.is_file() or p.suffix not in {".py", ".md", ".yaml", ".yml", ".html", ".ipynb", ".txt", ""}:
                continue
            text = p.read_text(errors="replace")
            cited += [f"{p.relative_to(ROOT)}: {name}" for name in PRIVATE if name in text]
    assert not cited, "files cite the private brief (cite the public source instead): " + "; ".join(cited)
