"""The benchmark's figures and the table they make: medians, ratios against the
baseline measured in the same run, and whether each meets its target."""

from __future__ import annotations

import re
import statistics
import sys
import time
from dataclasses import dataclass, field


@dataclass
class Figure:
    name: str
    unit: str
    values: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    baseline_name: str = ""
    target: str = ""

    def med(self, xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")

    def ratio(self) -> float:
        """The median over the baseline's median (NaN without a baseline)."""
        v, b = self.med(self.values), self.med(self.baseline)
        return v / b if self.baseline and b and v == v else float("nan")

    def met(self) -> bool | None:
        """Whether the figure meets its target, judged on the unrounded figures (a ratio
        of 0.396 printed as 0.40 does not meet ``>= 0.4``); None without a target or a
        measurement. A target without a unit, or in ``x``, bounds the ratio when the
        figure has a baseline; any other bounds the median: ``< 20 ms``, ``<= 3``, ``0``
        (exactly), ``~0`` (within 0.01)."""
        match = _TARGET.match(self.target)
        if match is None:
            return None
        op, bound, unit = match.group(1) or "==", float(match.group(2)), match.group(3) or ""
        on_ratio = bool(self.baseline) and unit in ("", "x")
        x = self.ratio() if on_ratio else self.med(self.values)
        if x != x:
            return None
        return {
            ">=": x >= bound,
            "<=": x <= bound,
            ">": x > bound,
            "<": x < bound,
            "==": x == bound,
            "~": abs(x - bound) < 0.01,
        }[op]

    def row(self) -> list[str]:
        def fmt(x: float) -> str:
            if x != x:
                return "-"
            if abs(x) >= 100:
                return f"{x:,.0f}"
            if abs(x) >= 10:
                return f"{x:.1f}"
            return f"{x:.2f}" if abs(x) >= 0.1 or x == 0 else f"{x:.3f}"

        v, b = self.med(self.values), self.med(self.baseline)
        spread = f"{fmt(min(self.values))}..{fmt(max(self.values))}" if self.values else "-"
        ratio = self.ratio()
        base = f"{fmt(b)} ({self.baseline_name})" if self.baseline else "-"
        met = {True: "yes", False: "no", None: ""}[self.met()]
        return [
            self.name,
            f"{fmt(v)} {self.unit}",
            spread,
            base,
            "-" if ratio != ratio else f"{ratio:.2f}",
            self.target,
            met,
        ]


# A target: a comparison (none: equal), a bound and the bound's unit, if any.


_TARGET = re.compile(r"(>=|<=|<|>|~)?\s*(\d+(?:\.\d+)?)\s*([A-Za-z][\w/-]*)?")


class Table:
    def __init__(self) -> None:
        self.figures: list[Figure] = []
        self.notes: list[str] = []

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        say(" | ".join(figure.row()))
        return figure

    def render(self) -> str:
        header = [
            "measurement",
            "median",
            "min..max",
            "baseline (same run)",
            "ratio",
            "target",
            "met",
        ]
        rows = [header] + [f.row() for f in self.figures]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = [
            "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
            for r in rows
        ]
        lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
        return "\n".join(lines + [""] + [f"- {n}" for n in [self.verdict(), *self.notes]])

    def verdict(self) -> str:
        """How many figures with a target met it, and which did not."""
        judged = [(f, f.met()) for f in self.figures]
        judged = [(f, met) for f, met in judged if met is not None]
        missed = [f.name.strip() for f, met in judged if not met]
        told = f"targets met: {len(judged) - len(missed)} of {len(judged)}"
        return told + (f"; missed: {'; '.join(missed)}" if missed else "")


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")
