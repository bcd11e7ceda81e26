"""The runtime package's size as issue 45 measures it: every line of every .py file.

    python -m tools.line_count            vllm_uma/: the total, then each top-level folder
    python -m tools.line_count PATH       the same for another package

The count is physical lines, blank lines, comments and docstrings included:
`find vllm_uma -name '*.py' | xargs cat | wc -l`. That is the method that gives
issue 45's figure (17,825 lines in 125 modules at commit 47f23c7); non-blank or
code-only counts give other numbers (15,234 and 14,562 there), so compare a
figure only with one taken this way.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Modules directly in the package, not in a folder of it.
TOP = "(top)"


def lines(path: Path) -> int:
    """What `wc -l` says of the file: its newlines, so a last line without one is not counted."""
    return path.read_bytes().count(b"\n")


def count(package: Path) -> tuple[int, int, dict[str, int]]:
    """(lines, modules, lines by top-level folder) for the .py files under ``package``."""
    folders: Counter[str] = Counter()
    modules = 0
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        folder = relative.parts[0] if len(relative.parts) > 1 else TOP
        folders[folder] += lines(path)
        modules += 1
    return sum(folders.values()), modules, dict(sorted(folders.items()))


def report(package: Path) -> str:
    total, modules, folders = count(package)
    width = max([len(name) for name in folders] + [5])
    rows = [f"{'total'.ljust(width)} {total:>7,}  ({modules} modules)"]
    rows += [f"{name.ljust(width)} {n:>7,}" for name, n in folders.items()]
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    package = Path(argv[0]) if argv else ROOT / "vllm_uma"
    if not package.is_dir():
        print(f"{package} is not a folder: name a package to count, e.g. vllm_uma", file=sys.stderr)
        return 2
    print(report(package))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
