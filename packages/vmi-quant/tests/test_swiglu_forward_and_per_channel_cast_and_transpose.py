"""swiglu_forward_and_per_channel_cast_and_transpose (TileKernels v1, spec quant-b §6.6) on the cpu
and ascend-sim targets, bit for bit against the torch reference (SwiGLU rounded to bf16, then
``reference.cast(act, "e4m3", (npt, 1))``, transposed), with errors raised before any kernel runs.

By default one kernel (transposed, npt 32, clamped, ascend flavor) over token counts 0, 128 and 256
and a partial last 128-channel tile; the other option combinations, ascend-sim and the lowerings
run under ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.targets import get_flavor
from vmi_core.tools.source_checks import assert_vector_regions, dma_counts, transcendental_calls
from vmi_core.tools.testing import assert_bitwise_equal, randn
from vmi_devkit.cases.swiglu_forward_cases import PER_CHANNEL_DEFAULT as DEFAULT
from vmi_devkit.cases.swiglu_forward_cases import PER_CHANNEL_FULL as FULL
from vmi_devkit.cuda import check_cuda_source
from vmi_devkit.errors import forbid_kernels
from vmi_quant.kernels.swiglu_forward_and_per_channel_cast_and_transpose import build_swiglu_per_channel
from vmi_quant.ops.swiglu_forward_and_per_channel_cast_and_transpose import (
    make_spec,
    swiglu_forward_and_per_channel_cast_and_transpose,
    swiglu_forward_and_per_channel_cast_and_transpose_parallel,
)
from vmi_quant.reference import swiglu_forward as reference

# (tokens, hidden): none; one 128-token tile row by 2.5 channel tiles; two by three.
SHAPES = [(0, 256), (128, 320), (256, 384)]


def _values(shape, seed):
    """bf16 ``(T, 2H)`` around the clamp values, with gates whose silu quotient is subnormal
    (1.5 * 2^-126) or zero blocks of a channel."""
    tokens, hidden = shape
    x = randn((tokens, 2 * hidden), seed) * 2
    if tokens:
        x[:, 1] = 1.5 * 2.0 ** -126
        x[:32, 2] = 0.0
    return x.bfloat16()


def _check(case, target=None, shapes=SHAPES):
    npt, round_sf, without_transpose, clamp, flavor = case
    for seed, shape in enumerate(shapes):
        x = _values(shape, seed)
        data, sf = swiglu_forward_and_per_channel_cast_and_transpose(
            x, "e4m3", npt, round_sf, without_transpose, clamp, target=target,
            flavor=None if target == "ascend-sim" else flavor)
        want_data, want_sf = reference.swiglu_forward_and_per_channel_cast_and_transpose(
            x, npt, round_sf, without_transpose, clamp, flavor)
        label = f"{case} shape={shape} target={target}"
        assert_bitwise_equal(data, want_data, f"data [{label}]")
        assert_bitwise_equal(sf, want_sf, f"sf [{label}]")


def test_matches_reference():
    _check(DEFAULT)


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL, ids=str)
def test_matches_reference_full(case):
    _check(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [DEFAULT, (128, True, True, None, "ascend")], ids=str)
def test_matches_reference_on_ascend_sim(case):
    _check(case, "ascend-sim", [(128, 320), (256, 128)])


def test_rounds_to_bf16_before_the_amax():
    # Spec §6.6: the amax is taken over the bf16 activation. Gate 1000 (silu = 1000 exactly), up
    # 0.44921875: fp32 act 449.21875, bf16 act 450 (the bf16 grid is 2 apart there), so the SF is
    # 450 / 448, not 449.21875 / 448. The op's definition (the reference path of the dispatch).
    x = torch.zeros(128, 256, dtype=torch.bfloat16)
    x[:, 0] = 1000.0
    x[:, 128] = 0.44921875
    data, sf = swiglu_forward_and_per_channel_cast_and_transpose(x, "e4m3", 32, target="torch")
    q = torch.tensor(448.0)
    assert torch.equal(sf[:, 0], torch.full((4,), 450.0) / q)
    assert (data.float()[0] == 448.0).all() and (sf[:, 1:] == torch.tensor(1e-4) / q).all()


def test_parallel_entry_and_torch_target():
    x = _values((128, 128), 5)
    got = swiglu_forward_and_per_channel_cast_and_transpose_parallel(x, "e4m3", 32, False, False, 0.5)
    want = swiglu_forward_and_per_channel_cast_and_transpose(x, "e4m3", 32, False, False, 0.5, target="torch")
    for a, b in zip(got, want, strict=True):
        assert_bitwise_equal(a, b, "parallel vs torch")
    with pytest.raises(ValueError, match="target 'torch'"):
        swiglu_forward_and_per_channel_cast_and_transpose_parallel(x, "e4m3", 32, target="torch")


X = torch.zeros(128, 256, dtype=torch.bfloat16)


@pytest.mark.parametrize("call,error,match", [
    (lambda: swiglu_forward_and_per_channel_cast_and_transpose("x", "e4m3", 32), TypeError, "x must be a torch.Tensor"),
    (lambda: swiglu_forward_and_per_channel_cast_and_transpose(X.float(), "e4m3", 32), TypeError,
     "x must be bfloat16"),
    (lambda: swiglu_forward_and_per_channel_cast_and_transpose(X[:64], "e4m3", 32), ValueError, "multiple of 128"),
    (lambda: swiglu_forward_and_per_channel_cast_and_transpose(X[:, :192], "e4m3", 32), ValueError,
     "multiple of 128"),
    (lambda: swiglu_forward_and_per_channel_cast_and_transpose(X[0], "e4m3", 32), ValueError, "2-D"),
    (lambda: swiglu_forward_and_per_channel_cast_and_transpose(X.t(), "e4m3", 32), ValueError, "unit stride"),
    (lambda: swiglu_forward_and_per_channel_cast_and_transpose(X, "bf16", 32), ValueError, "fmt must be 'e4m3'"),
    (lambda: swiglu_forward_and_per_channel_cast_and_transpose(X, 3, 32), TypeError, "fmt"),
    (lambda: swiglu_forward_and_per_channel_cast_and_transpose(X, "e4m3", 64), ValueError,
     "num_per_tokens must be one of"),
    (lambda: swiglu_forward_and_per_channel_cast_and_transpose(X, "e4m3", 32, round_sf=1), TypeError, "round_sf"),
    (lambda: swiglu_forward_and_per_channel_cast_and_transpose(X, "e4m3", 32, without_transpose="no"), TypeError,
     "without_transpose"),
    (lambda: swiglu_forward_and_per_channel_cast_and_transpose(X, "e4m3", 32, swiglu_clamp_value=-1.0), ValueError,
     "swiglu_clamp_value must be >= 0"),
    (lambda: swiglu_forward_and_per_channel_cast_and_transpose(X, "e4m3", 32, swiglu_clamp_value=float("inf")),
     ValueError, "swiglu_clamp_value must be finite"),
])
def test_bad_input(monkeypatch, call, error, match):
    forbid_kernels(monkeypatch, "vmi_quant.kernels.swiglu_forward_and_per_channel_cast_and_transpose", why="bad input")
    with pytest.raises(error, match=match):
        call()


def _spec(case):
    npt, round_sf, without_transpose, clamp, flavor = case
    return make_spec(npt, round_sf, not without_transpose, clamp is not None, get_flavor(flavor))


@pytest.mark.slow
@pytest.mark.parametrize("case", [DEFAULT, (128, True, True, None, "ascend")], ids=str)
def test_ascend_lowering(case):
    # SwiGLU and its bf16 rounding in a SIMT region (vmi's correctly rounded exp); one SIMD region
    # (column amax, scales, and the codes without the transpose); the transposed codes in a SIMT
    # region. DMA: gate and up tiles in; data and SF out.
    src = build_swiglu_per_channel.source(_spec(case), "ascend")
    assert_vector_regions(src, simd=1, simt=1 if case[2] else 2)
    assert dma_counts(src) == (2, 2)
    assert "vmi_exp(" in src and transcendental_calls(src) == []


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_lowering_compiles():
    src = build_swiglu_per_channel.source(_spec((128, True, False, 10.0, "cuda")), "cuda")
    assert "__global__ void" in src
    check_cuda_source(src)
