"""What a benchmark writes: its JSON, and its figures as fixed-width tables.

A table is a list of columns, each a title, a width and how a value is
written; a header and each row come out as one line, columns one space
apart (or ``gap`` spaces), so a benchmark can put its own lines between
rows. A value of None is written ``-``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30


def write_json(path: Path, result: dict | list) -> None:
    """``result`` as indented JSON; anything JSON has no type for as its str()."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")


def missing_chart_library(prog: str, target: str) -> str | None:
    """The one-line error when matplotlib, which draws a benchmark's PNG, is
    not installed (checked before the run, not after it); None when it is."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        return None
    return (
        f"{prog}: matplotlib is missing (it draws the PNG chart): run `{target}`, "
        f"or `.venv/bin/pip install -e '.[bench]'`"
    )


def gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / GiB:.2f}"


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100); with fewer than two
    values, the value itself."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def at_rank(sorted_values: list[float], fraction: float) -> float:
    """The value ``fraction`` of the way up ``sorted_values`` (ascending),
    its index rounded down: a value that was measured, never interpolated
    (the p99 of the fleet and ledger benchmarks)."""
    return sorted_values[int(fraction * (len(sorted_values) - 1))]


@dataclass(frozen=True)
class Column:
    title: str
    width: int
    cell: str = "{}"  # str.format pattern of one value
    left: bool = False  # text columns: left-aligned, like their title
    gap: int = 1  # spaces before the column (none before the first)
    unit: float = 1  # a number is written in these: 1e3 writes microseconds as ms


class Table:
    def __init__(self, columns: Sequence[Column]):
        self.columns = list(columns)

    def header(self) -> str:
        return self._line(c.title for c in self.columns)

    def row(self, values: Sequence) -> str:
        if len(values) != len(self.columns):
            raise ValueError(
                f"a row of {len(values)} values for {len(self.columns)} columns "
                f"({', '.join(c.title for c in self.columns)}): give one value a column"
            )
        return self._line(_cell(c, v) for c, v in zip(self.columns, values, strict=True))

    def _line(self, cells) -> str:
        out = []
        for i, (column, cell) in enumerate(zip(self.columns, cells, strict=False)):
            pad = cell.ljust if column.left else cell.rjust
            out.append(" " * (column.gap if i else 0) + pad(column.width))
        return "".join(out)


def _cell(column: Column, value) -> str:
    if value is None:
        return "-"
    if column.unit != 1:
        value = value / column.unit
    return column.cell.format(value)
