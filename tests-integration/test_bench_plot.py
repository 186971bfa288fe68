"""``vmi bench --plot``: the chart file and its series."""

from __future__ import annotations

import struct
import sys

from vmi_core.tools import plot
from vmi_core.tools.cli import main


def png_chunks(data: bytes) -> dict[bytes, list[bytes]]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks: dict[bytes, list[bytes]] = {}
    pos = 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        chunks.setdefault(kind, []).append(data[pos + 8:pos + 8 + length])
        pos += 12 + length
    return chunks


def png_text(chunks) -> dict[str, str]:
    return dict(chunk.decode("latin-1").split("\0", 1) for chunk in chunks.get(b"tEXt", []))


ROWS = {(1, 256): {"nbytes": 2e3, "kernel_s": 1e-6, "ref_s": 1e-4, "base_s": 2e-6},
        (64, 256): {"nbytes": 1.3e5, "kernel_s": 2e-5, "ref_s": 5e-3},  # the baseline failed here
        (4096, 256): {"nbytes": 8e6, "kernel_s": 1e-3, "ref_s": 0.3, "base_s": 4e-3}}


def test_figure_has_kernel_reference_baseline_and_copy_lines():
    fig = plot.throughput_figure("cast", ROWS, 20e9)
    assert plot.series(fig) == ["kernel", "reference", "baseline", "copy bandwidth"]
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert list(lines["kernel"].get_xdata()) == [1, 64, 4096]
    assert list(lines["baseline"].get_xdata()) == [1, 4096]
    assert list(lines["baseline"].get_ydata()) == [1.0, 2.0]  # GB/s
    assert list(lines["copy bandwidth"].get_ydata()) == [20.0, 20.0]


def test_a_long_title_stays_inside_the_figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    title = ("swiglu_forward_and_per_token_cast (fmt=e4m3, num_per_channels=32, use_tma_aligned_col_major_sf=True, "
             "round_sf=True, use_packed_ue8m0=True, psum=True), cpu, 2 threads, flavor ascend, hidden 7168")
    fig = plot.throughput_figure(title, ROWS, 20e9)
    FigureCanvasAgg(fig).draw()
    box = fig.axes[0].title.get_window_extent()
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width
    assert " ".join(fig.axes[0].get_title().splitlines()) == title


def test_figure_without_a_baseline_has_three_lines():
    rows = {shape: {k: v for k, v in r.items() if k != "base_s"} for shape, r in ROWS.items()}
    assert plot.series(plot.throughput_figure("cast", rows, 20e9)) == ["kernel", "reference", "copy bandwidth"]


def test_bench_plot_writes_a_png_with_its_series(tmp_path, capsys):
    path = tmp_path / "cast.png"
    assert main(["bench", "cast", "--shape", "64x256", "--tokens", "4,64", "--min-time", "0.01", "--threads", "1",
                 "--plot", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"written to {path}" in out
    assert "4x256" in out and "64x256" in out
    chunks = png_chunks(path.read_bytes())
    width, height = struct.unpack(">II", chunks[b"IHDR"][0][:8])
    assert (width, height) == (800, 500)
    text = png_text(chunks)
    assert text["Series"] == "kernel|reference|baseline|copy bandwidth"
    assert text["Title"].startswith("cast (in_dtype=fp32, dtype=bf16, stochastic_rounding=False), cpu, 1 thread")


def test_bench_plot_without_matplotlib_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["bench", "cast", "--plot", str(tmp_path / "x.png")]) == 2
    assert "pip install 'vmi-core[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
