"""Figures the README repeats from the docs say the same in both places."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CRASH_TABLE_HEADER = "| Provider | What continues the run | Measured |"


def crash_table(path: Path) -> list[str]:
    """The rows of the "what continues a run after a crash" table in *path*."""
    lines = path.read_text().splitlines()
    start = lines.index(CRASH_TABLE_HEADER) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_readme_quotes_the_crash_figures_the_docs_measured() -> None:
    readme = crash_table(ROOT / "README.md")
    docs = crash_table(ROOT / "docs" / "workflows.md")
    assert readme, "the README has no crash table"
    missing = [row for row in readme if row not in docs]
    assert not missing, f"README rows that docs/workflows.md says otherwise: {missing}"
