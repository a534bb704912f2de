"""A PNG bar chart next to a benchmark's JSON results (matplotlib, no display).

    save_bars(path, title, categories, {"series": [value per category]}, ylabel)

Grouped bars, one group per category and one bar per series (None: no bar);
each bar is labelled with its value. Returns the path written, or None when
matplotlib is not installed (the JSON stays the result; the chart is a view).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def _label(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def save_bars(path: Path, title: str, categories: Sequence[str],
              series: dict[str, Sequence[float | None]], ylabel: str) -> Path | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count = max(1, len(series))
    width = 0.8 / count
    fig, ax = plt.subplots(figsize=(min(14.0, max(6.0, 0.6 * len(categories) * count)), 5.0), dpi=100)
    for index, (name, values) in enumerate(series.items()):
        xs = [i + (index - (count - 1) / 2) * width for i in range(len(categories))]
        bars = ax.bar([x for x, v in zip(xs, values) if v is not None],
                      [v for v in values if v is not None], width=width, label=name)
        ax.bar_label(bars, fmt=_label, fontsize=6)
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels(categories, rotation=30 if len(categories) > 4 else 0, ha="right"
                       if len(categories) > 4 else "center", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
