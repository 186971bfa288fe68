"""Decode-size calls on cpu: fewer tokens than a tile's height run on the tokens cut into
tile-wide rows (``vmi_core.cpu_parallel.fold_rows``), bit for bit the reference's answer.

Each case asserts that the fold is taken (or, for stochastic rounding and column-major SF, that
it is not), so the comparison covers the folded launch and not only the plain one.
"""

from __future__ import annotations

import sys

import pytest
import torch

import vmi_core.kernel as vmi_kernel
from vmi_core.plan import invalidate
from vmi_core.tools.registry import discover
from vmi_quant.ops.cast_back import cast_back
from vmi_quant.ops.per_token_cast import per_token_cast
from vmi_quant.ops.per_token_cast_and_cast_back import per_token_cast_and_cast_back

OPS = discover()
HIDDEN = 512  # four 128-wide pieces per token


def _folds(module_name: str, monkeypatch) -> list[int]:
    """Rows of every kernel launch of ``module_name`` (recorded through the ``launch_rows`` that
    ``Kernel.launch_rows`` runs; each test calls the op of that one module). Plans are forgotten:
    a planned call launches without ``launch_rows``."""
    assert module_name in sys.modules
    invalidate()
    launched: list[int] = []
    original = vmi_kernel.launch_rows

    def recording(target, run, num_rows, **kwargs):
        launched.append(num_rows)
        return original(target, run, num_rows, **kwargs)

    monkeypatch.setattr(vmi_kernel, "launch_rows", recording)
    return launched


def _check(op_name: str, options: dict, tokens: int, flavor: str) -> None:
    op = OPS[op_name]
    values = op.parse_options([f"{k}={v}" for k, v in options.items()])
    inputs = op.make_inputs((tokens, HIDDEN), values, tokens)
    got = op.run(inputs, values, "cpu", flavor)
    mismatches = op.check(got, op.reference(inputs, values, flavor))
    assert not mismatches, "\n".join(mismatches)


PTC_CASES = [
    {},
    {"fmt": "e2m1", "num_per_channels": 16},
    {"num_per_channels": 128, "in_dtype": "fp32"},
    {"round_sf": True, "use_packed_ue8m0": True},
    {"round_sf": True, "use_packed_ue8m0": True, "num_per_channels": 64},
    {"use_e4m3_sf": True},
]


@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
@pytest.mark.parametrize("options", PTC_CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("tokens", [1, 5, 31])
def test_per_token_cast_decode_fold(monkeypatch, options, tokens, flavor):
    launched = _folds("vmi_quant.kernels.per_token_cast", monkeypatch)
    _check("per_token_cast", options, tokens, flavor)
    packed_words = 2 if flavor == "ascend" else 4
    groups_per_piece = 128 // options.get("num_per_channels", 32)
    folds = not options.get("use_packed_ue8m0") or groups_per_piece % packed_words == 0
    assert launched == [tokens * HIDDEN // 128 if folds else tokens]


@pytest.mark.parametrize("options", [{"stochastic_cast": True}, {"use_tma_aligned_col_major_sf": True}])
def test_per_token_cast_does_not_fold_what_depends_on_columns_or_layout(monkeypatch, options):
    launched = _folds("vmi_quant.kernels.per_token_cast", monkeypatch)
    _check("per_token_cast", options, 3, "ascend")
    assert launched == [3]


def test_per_token_cast_does_not_fold_strided_rows(monkeypatch):
    launched = _folds("vmi_quant.kernels.per_token_cast", monkeypatch)
    x = torch.randn(3, 2 * HIDDEN, dtype=torch.bfloat16)[:, :HIDDEN]
    got = per_token_cast(x, "e4m3", 32, target="cpu")
    want = per_token_cast(x, "e4m3", 32, target="torch")
    assert launched == [3]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))


@pytest.mark.parametrize("options", [{}, {"block_k": 128}, {"x_fmt": "e2m1"}, {"round_sf": True, "use_e4m3_sf": False},
                                     {"round_sf": True, "use_packed_ue8m0": True}])
@pytest.mark.parametrize("tokens", [1, 7])
def test_cast_back_decode_fold(monkeypatch, options, tokens):
    launched = _folds("vmi_quant.kernels.cast_back", monkeypatch)
    _check("cast_back", options, tokens, "ascend")
    assert launched == [tokens * HIDDEN // 128]


@pytest.mark.parametrize("options", [{}, {"fmt": "e2m1", "num_per_channels": 16}, {"in_dtype": "fp32"}])
@pytest.mark.parametrize("tokens", [1, 9])
def test_per_token_cast_and_cast_back_decode_fold(monkeypatch, options, tokens):
    launched = _folds("vmi_quant.kernels.per_token_cast_and_cast_back", monkeypatch)
    _check("per_token_cast_and_cast_back", options, tokens, "ascend")
    assert launched == [tokens * HIDDEN // 128]


def test_fold_leaves_the_caller_tensors_shaped():
    x = torch.randn(2, HIDDEN, dtype=torch.bfloat16)
    in_place = x.clone()
    per_token_cast_and_cast_back(in_place, "e4m3", 32)
    assert in_place.shape == x.shape and in_place.is_contiguous()
    data, sf = per_token_cast(x, "e4m3", 32)
    assert data.shape == (2, HIDDEN) and sf.shape == (2, HIDDEN // 32)
    back = cast_back((data, sf), "bf16", (1, 32))
    assert back.shape == (2, HIDDEN)
