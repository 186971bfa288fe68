"""The chart of ``vmi bench --plot``: throughput (GB/s) against token count.

One chart per op and options: the cpu kernel, the torch reference and the op's baseline (when one
is installed) as lines over token counts at one hidden size, and the machine's copy bandwidth as a
horizontal line. matplotlib is optional: ``pip install 'vmi-core[plot]'``.

The PNG's text metadata holds the chart's title (``Title``) and its series names in legend order,
separated by ``|`` (``Series``), so a script can tell what a saved chart shows without drawing it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

KERNEL, REFERENCE, BASELINE, COPY = "kernel", "reference", "baseline", "copy bandwidth"
SERIES_KEY = "Series"
# Characters per title line: what the 8-inch figure shows at the title's 10 pt.
TITLE_COLUMNS = 90


def require_matplotlib() -> None:
    """ImportError with the install command when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError("vmi bench --plot needs matplotlib: pip install 'vmi-core[plot]'") from None


def throughput_figure(title: str, rows: dict[tuple[int, ...], dict], copy_bps: float):
    """A matplotlib Figure of ``rows`` (shape -> ``vmi bench``'s timings at that shape: ``nbytes``,
    ``kernel_s``, ``ref_s`` and, where the baseline ran, ``base_s``) against the shapes' token counts."""
    from matplotlib.figure import Figure

    shapes = sorted(rows)
    tokens = [shape[0] for shape in shapes]

    def gbps(key: str) -> tuple[list[int], list[float]]:
        points = [(shape[0], rows[shape]["nbytes"] / rows[shape][key] / 1e9) for shape in shapes if key in rows[shape]]
        return [x for x, _ in points], [y for _, y in points]

    fig = Figure(figsize=(8, 5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.plot(*gbps("kernel_s"), marker="o", label=KERNEL)
    ax.plot(*gbps("ref_s"), marker="s", label=REFERENCE)
    base = gbps("base_s")
    if base[0]:
        ax.plot(*base, marker="^", label=BASELINE)
    ax.axhline(copy_bps / 1e9, color="gray", linestyle="--", label=COPY)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(tokens, [str(t) for t in tokens])
    ax.set_xlabel("tokens (rows)")
    ax.set_ylabel("GB/s (bytes read + written / time)")
    # Wrapped: a one-line title of an op with options runs past the figure's edges.
    ax.set_title(textwrap.fill(title, TITLE_COLUMNS), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


def series(fig) -> list[str]:
    """The series names of a ``throughput_figure``, in legend order."""
    return [text.get_text() for text in fig.axes[0].get_legend().get_texts()]


def save_png(fig, path: Path) -> None:
    """Write ``fig`` as a PNG with its title and series in the text metadata."""
    metadata = {"Title": " ".join(fig.axes[0].get_title().splitlines()), SERIES_KEY: "|".join(series(fig))}
    fig.savefig(path, format="png", metadata=metadata)
