"""swiglu_backward and swiglu_backward_and_per_token_cast (spec quant-b §7) on the cpu and
ascend-sim targets, bit for bit against the torch reference of their flavor; the reference
against the float64 derivative.

Each case is one compiled kernel (the hidden size and the options are its specialisation; token
count, row strides, psum, weights, factors and the clamp value are runtime values). The default
cases cover the plain path in both flavors, the E4M3 path with both group sizes in two SF layouts,
every optional input and output, psum padding (rows inside, between and after the experts), token
counts 0, 1 and tile tails, and strided rows; the other SF layouts and option combinations run
under ``slow``. Every output is compared with dtype, shape, strides and bits (the weight
gradient's fixed summation order makes it reproducible too).
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import REUSE_SCHEDULES, SIM_SCHEDULES, assert_bitwise_equal, generator, randn, sim_schedule
from vmi_devkit.cases.swiglu_backward_cases import COVERING, DTYPES, FULL, SF_OPTIONS, case_id
from vmi_devkit.errors import forbid_kernels
from vmi_quant import reference
from vmi_quant.config import reset_runtime_config, set_token_alignment
from vmi_quant.inputs import expert_rows
from vmi_quant.kernels.swiglu_backward import block_rows
from vmi_quant.ops.swiglu_backward import (
    swiglu_backward,
    swiglu_backward_and_per_token_cast,
    swiglu_backward_and_per_token_cast_parallel,
    swiglu_backward_parallel,
)
from vmi_quant.reference import swiglu_backward as reference_backward

# One ascend-sim kernel by default (an ascend-sim build takes half a minute); the E4M3 path runs
# on ascend-sim under ``slow``.
SIM_COVERING = [COVERING[0]]
SIM_FULL = [
    COVERING[3],
    ("e4m3", "bf16", 128, "fp32", "ascend", True, None, None, False, True, 256),
    ("e4m3", "fp32", 32, "pow2-col", "ascend", False, None, 0.5, True, False, 128),
]
ALIGNMENT = 8
# Expert sizes of the psum layout (alignment 8): rows 0-2, an empty expert, rows 8-20, 24-32.
COUNTS = [3, 0, 13, 9]
# ascend-sim: 129 work tiles of 8 rows (H 128) over 64 cores, so core 0 runs 3, more than its 2
# buffer versions: under consumers_first and producers_first (one reference for both launches: the
# reference is the cost) a missing wait between pipes shows up.
SIM_WRAPPING_TOKENS = 1025


def _counts(num_tokens):
    """Expert sizes for ``num_tokens`` rows: ``COUNTS``, and past 64 rows two more experts over
    most of the rest (the last 16 rows and the alignment gaps stay padding)."""
    if num_tokens <= 64:
        return COUNTS
    rest = num_tokens - 40 - 16
    return COUNTS + [rest // 2, rest - rest // 2]


def _psum(counts, alignment):
    ends, start = [], 0
    for count in counts:
        start = -(-start // alignment) * alignment
        ends.append(start + count)
        start += count
    return torch.tensor(ends, dtype=torch.int32)


def _gate_and_up(num_tokens, hidden, seed):
    """fp32 ``(N, 2H)``: normal values times 3 (many clamped by 0.5), a gate of -88 (a subnormal
    sigmoid, which the ascend flavor flushes) and a subnormal gate value."""
    x = randn((num_tokens, 2 * hidden), seed) * 3
    if num_tokens:
        x[0, 0] = -88.0
        x[-1, 1] = 3e-39
    return x


def _inputs(case, num_tokens, seed, *, psum=None):
    """``(x, act_x_grad, topk_weights)``: a plain tensor or an E4M3 ``(data, sf)`` pair; rows
    outside the experts of ``psum`` hold NaN and large values (written as +0 anyway)."""
    in_fmt, grad_fmt, npc, _, _, weights, *_, hidden = case
    values = _gate_and_up(num_tokens, hidden, seed)
    grad = randn((num_tokens, hidden), seed + 1)
    topk = torch.rand(num_tokens, generator=generator(seed + 2)) if weights else None
    if psum is not None:
        padding = ~expert_rows(psum, num_tokens, ALIGNMENT)
        values[padding] = torch.where(torch.arange(2 * hidden) % 3 == 0, float("nan"), 1e30)
        grad[padding] = float("nan")
        if topk is not None:
            topk[padding] = 7.0
    if npc is None:
        x = values.to(DTYPES[in_fmt])
    else:
        x = reference.cast(torch.nan_to_num(values, nan=0.0), "e4m3", (1, npc))
        if psum is not None:
            x[0].view(torch.uint8)[padding] = 0x7F
    return x, grad.to(DTYPES[grad_fmt]), topk


def _expected(case, x, grad, topk, psum):
    in_fmt, grad_fmt, npc, layout, flavor, weights, rsf, clamp, recompute, _, hidden = case
    valid = expert_rows(psum, grad.shape[0], ALIGNMENT)
    a, b = reference_backward.dequantize_halves(x, npc)
    d_a, d_b, act_out, weight_grad = reference_backward.swiglu_backward(a, b, grad, valid, topk, rsf, clamp, flavor)
    full = torch.cat([d_a, d_b], dim=1)
    out_dtype = torch.bfloat16 if npc is not None else DTYPES[in_fmt]
    results = [full.to(out_dtype)]
    if npc is not None:
        results.append(reference_backward.quantize_grad(full, valid, npc, flavor=flavor, **SF_OPTIONS[layout]))
    if weights:
        results.append(weight_grad)
    if recompute:
        results.append(act_out.to(out_dtype))
    return results


def _run(case, x, grad, topk, psum, target, flavor):
    in_fmt, grad_fmt, npc, layout, _, weights, rsf, clamp, recompute, _, hidden = case
    options = dict(psum_num_tokens_per_expert=psum, topk_weights=topk, routed_scaling_factor=rsf,
                   clamp_value=clamp, do_recompute=recompute, target=target, flavor=flavor)
    if npc is None:
        return swiglu_backward(x, grad, in_fmt, **options)
    return swiglu_backward_and_per_token_cast(x, grad, "e4m3", npc, **options, **SF_OPTIONS[layout])


def _assert_results(got, want, label):
    assert len(got) == len(want), label
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        if isinstance(b, tuple):
            assert_bitwise_equal(a[0], b[0], f"x_grad_fp8 [{label}]")
            assert_bitwise_equal(a[1], b[1], f"x_grad_fp8_sf [{label}]")
        else:
            assert_bitwise_equal(a, b, f"output {k} [{label}]")


def _token_counts(case):
    rows = block_rows(case[-1])
    # Empty, one token, and tiles with a tail; with psum, the rows past the last expert.
    return [0, 1, 5 * rows + 3] if not case[9] else [0, 45]


def _check_case(case, *, target=None, offset=0, tokens=None, schedules=None):
    """Each token count under ``schedules`` (one launch each against one reference), by default the
    next of ``SIM_SCHEDULES``."""
    flavor = case[4]
    set_token_alignment(ALIGNMENT)
    try:
        for seed, num_tokens in enumerate(tokens or _token_counts(case)):
            psum = _psum(_counts(num_tokens), ALIGNMENT) if case[9] and num_tokens else None
            x, grad, topk = _inputs(case, num_tokens, seed, psum=psum)
            want = _expected(case, x, grad, topk, psum)
            for schedule in schedules or [SIM_SCHEDULES[(seed + offset) % len(SIM_SCHEDULES)]]:
                with sim_schedule(schedule):
                    got = _run(case, x, grad, topk, psum, target, None if target == "ascend-sim" else flavor)
                _assert_results(got, want, f"{case_id(case)} N={num_tokens} target={target} schedule={schedule}")
    finally:
        reset_runtime_config()


@pytest.mark.parametrize("case", COVERING, ids=case_id)
def test_matches_reference(case):
    _check_case(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL, ids=case_id)
def test_matches_reference_full(case):
    _check_case(case)


@pytest.mark.parametrize("case", SIM_COVERING, ids=case_id)
def test_matches_reference_on_ascend_sim(case):
    # One kernel build: the reference cases, then strided rows and a 3-D batch.
    _check_case(case, target="ascend-sim")
    _check_case(case, target="ascend-sim", tokens=[SIM_WRAPPING_TOKENS],
                schedules=REUSE_SCHEDULES)
    _check_strided_and_3d(case, "ascend-sim")


@pytest.mark.slow
@pytest.mark.parametrize("case", SIM_FULL, ids=case_id)
def test_matches_reference_on_ascend_sim_full(case):
    _check_case(case, target="ascend-sim", offset=SIM_FULL.index(case))


@pytest.mark.slow
@pytest.mark.parametrize("hidden", [3584, 7168])
def test_large_shape(hidden):
    # TileKernels' MoE test sizes: 4001 tokens, one row per work tile; psum padding included.
    case = ("e4m3", "bf16", 32, "packed-col", "ascend", True, 2.5, 0.5, True, True, hidden)
    set_token_alignment(128)
    try:
        psum = _psum([700, 0, 1500, 1400], 128)
        x, grad, topk = _inputs(case, 4001, 31, psum=psum)
        got = _run(case, x, grad, topk, psum, None, "ascend")
        valid = expert_rows(psum, 4001, 128)
        a, b = reference_backward.dequantize_halves(x, 32)
        d_a, d_b, act_out, weight_grad = reference_backward.swiglu_backward(a, b, grad, valid, topk, 2.5, 0.5)
        full = torch.cat([d_a, d_b], dim=1)
        want = [full.bfloat16(), reference_backward.quantize_grad(full, valid, 32, **SF_OPTIONS["packed-col"]),
                weight_grad, act_out.bfloat16()]
    finally:
        reset_runtime_config()
    _assert_results(got, want, f"H={hidden}")


def test_flavors_differ_where_the_spec_says():
    # fp32 outputs of COVERING[1] and [2]: the fused 1 + a'(1 - s) of the cuda flavor changes
    # some dA bits; dB never depends on it; the ascend flavor flushes the subnormal sigmoid of
    # the gate -88 (dB = gws * a' becomes a zero) where the cuda flavor keeps it.
    x, grad, _ = _inputs(COVERING[1], 64, 5)
    ascend = swiglu_backward(x, grad, "fp32", flavor="ascend")[0]
    cuda = swiglu_backward(x, grad, "fp32", flavor="cuda")[0]
    d_a_differs = ascend[:, :64] != cuda[:, :64]
    assert d_a_differs.any()
    assert torch.equal(ascend[1:, 64:], cuda[1:, 64:])
    assert ascend[0, 64] == 0 and cuda[0, 64] != 0 and cuda[0, 64].abs() < 2.0**-100


def test_padding_rows_are_positive_zeros():
    # Whatever padding rows hold (NaN, 1e30, weights 7), every output there is +0 / code 0 / SF 0:
    # the kernel of COVERING[3] (packed column-major SF, whose padding-row words are whole words).
    case = COVERING[3]
    set_token_alignment(ALIGNMENT)
    try:
        psum = _psum(COUNTS, ALIGNMENT)
        x, grad, topk = _inputs(case, 45, 9, psum=psum)
        results = _run(case, x, grad, topk, psum, None, "ascend")
        # TileKernels' empty expert may also end before its aligned start (at the previous end, 3,
        # not at 8): the same rows, the same results.
        early_end = psum.clone()
        early_end[1] = psum[0]
        _assert_results(_run(case, x, grad, topk, early_end, None, "ascend"), results, "empty expert ending early")
    finally:
        reset_runtime_config()
    x_grad, (data, sf), weight_grad, act_out = results
    padding = ~expert_rows(psum, 45, ALIGNMENT)
    assert padding.sum() == 45 - sum(COUNTS)
    for name, t in (("x_grad", x_grad), ("act_out", act_out), ("weight_grad", weight_grad)):
        bits = t[padding].float().view(torch.int32)
        assert not bits.any(), name
    assert not data.view(torch.uint8)[padding].any()
    assert not sf[padding].any()
    assert sf[~padding].all()


def _check_strided_and_3d(case, target=None):
    """Rows with a padded stride (2-D views) and a contiguous 3-D batch give the results of the
    contiguous 2-D tensors."""
    hidden, npc = case[-1], case[2]
    x, grad, topk = _inputs(case, 24, 11)
    grad_wide = torch.zeros((24, hidden + 64), dtype=grad.dtype)
    grad_wide[:, :hidden] = grad
    # With psum, one expert of every row (the same kernel specialisation as the case's).
    psum = torch.tensor([24], dtype=torch.int32) if case[9] else None
    options = dict(psum_num_tokens_per_expert=psum, topk_weights=topk, routed_scaling_factor=case[6],
                   clamp_value=case[7], do_recompute=case[8], flavor=None if target == "ascend-sim" else case[4])
    with sim_schedule("consumers_first"):
        if npc is None:
            x_wide = torch.zeros((24, 2 * hidden + 64), dtype=x.dtype)
            x_wide[:, :2 * hidden] = x
            got = swiglu_backward(x_wide[:, :2 * hidden], grad_wide[:, :hidden], case[0], target=target, **options)
            batched = swiglu_backward(x.view(2, 12, -1), grad.view(2, 12, -1), case[0], target=target, **options)
            want = swiglu_backward(x, grad, case[0], target="torch", **options)
        else:
            options.update(SF_OPTIONS[case[3]])
            got = swiglu_backward_and_per_token_cast(x, grad_wide[:, :hidden], "e4m3", npc, target=target, **options)
            batched = swiglu_backward_and_per_token_cast((x[0].view(2, 12, -1), x[1]), grad.view(2, 12, -1),
                                                         "e4m3", npc, target=target, **options)
            want = swiglu_backward_and_per_token_cast(x, grad, "e4m3", npc, target="torch", **options)
    _assert_results(got, want, f"strided {case_id(case)} target={target}")
    _assert_results(batched, want, f"3-D {case_id(case)} target={target}")


def test_strided_and_3d_inputs():
    # The kernel of COVERING[3] (E4M3 input; its gradient strided); ascend-sim: below.
    _check_strided_and_3d(COVERING[3])


def test_reference_against_float64_derivative():
    # The reference's fp32 steps against autograd of silu(min(a, c)) * clamp(b, -c, c) in float64
    # (both flavors): every gradient within a few fp32 rounding errors of its terms' magnitude, and
    # the weight gradient within 1e-5 relative of the float64 sum (4096 terms of fp32 products).
    torch.manual_seed(0)
    a, b = randn((64, 4096), 1) * 3, randn((64, 4096), 2) * 3
    g, topk, rsf, c = randn((64, 4096), 3), torch.rand(64, generator=generator(4)), 2.5, 4.0
    valid = torch.ones(64, dtype=torch.bool)
    a64, b64 = a.double().requires_grad_(), b.double().requires_grad_()
    w64 = topk.double() * rsf
    act64 = torch.nn.functional.silu(torch.clamp(a64, max=c)) * torch.clamp(b64, -c, c)
    (act64 * g.double() * w64[:, None]).sum().backward()
    weight_grad64 = (act64.detach() * g.double()).sum(dim=1) * rsf
    for flavor in ("ascend", "cuda"):
        d_a, d_b, act_out, weight_grad = reference_backward.swiglu_backward(a, b, g, valid, topk, rsf, c, flavor)
        scale = (g.double().abs() * w64[:, None]) * (b64.detach().abs().clamp(max=c) + 1) * (a64.detach().abs() + 1)
        assert ((d_a.double() - a64.grad).abs() <= 2.0**-20 * scale).all(), flavor
        assert ((d_b.double() - b64.grad).abs() <= 2.0**-20 * scale).all(), flavor
        assert ((act_out.double() - act64.detach() * w64[:, None]).abs()
                <= 2.0**-20 * (act64.detach().abs() * w64[:, None] + 2.0**-126)).all(), flavor
        terms = (act64.detach() * g.double()).abs().sum(dim=1) * rsf
        assert ((weight_grad.double() - weight_grad64).abs() <= 1e-5 * terms).all(), flavor


def test_no_tokens_launch_nothing(monkeypatch):
    forbid_kernels(monkeypatch, why="N == 0")
    x = reference.cast(torch.empty(0, 256), "e4m3", (1, 32))
    x_grad, (data, sf), weight_grad = swiglu_backward_and_per_token_cast(
        x, torch.empty(0, 128), "e4m3", 32, topk_weights=torch.empty(0), round_sf=True, use_packed_ue8m0=True)
    assert x_grad.shape == (0, 256) and x_grad.dtype == torch.bfloat16
    assert data.shape == (0, 256) and sf.shape == (0, 4) and sf.dtype == torch.int16
    assert weight_grad.shape == (0,)


def test_torch_target_and_parallel_entry_points():
    case = COVERING[1]
    x, grad, _ = _inputs(case, 16, 21)
    want = swiglu_backward(x, grad, "fp32", target="torch")
    _assert_results(swiglu_backward_parallel(x, grad, "fp32"), want, "parallel entry point")
    with pytest.raises(ValueError, match="target 'torch'"):
        swiglu_backward_parallel(x, grad, "fp32", target="torch")
    quantized = reference.cast(x.float(), "e4m3", (1, 32))
    with pytest.raises(ValueError, match="target 'torch'"):
        swiglu_backward_and_per_token_cast_parallel(quantized, grad, "e4m3", 32, target="torch")


def test_custom_op_returns_fixed_tuple():
    # torch.ops.vmi.* always return every output; absent ones are empty.
    x, grad, _ = _inputs(COVERING[1], 8, 23)
    x_grad, weight_grad, act_out = torch.ops.vmi.swiglu_backward(x, grad, "fp32", target="torch")
    assert x_grad.shape == (8, 128) and weight_grad.shape == (0,) and act_out.shape == (0, 64)


@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
def test_a_zero_clamp_keeps_the_sign_of_zero(flavor):
    # clamp_value 0: the clamped up value -0.0 and a gate of -0.0 stay -0.0 (compare and select, as
    # the reference); min/max gave +0.0 and flipped the sign of zero gradients and activations.
    gate_up = torch.zeros(1, 256)
    gate_up[0, 0], gate_up[0, 128] = -1.0, -1.0
    gate_up[0, 1], gate_up[0, 129] = -0.0, 1.0
    x = gate_up.to(torch.bfloat16)
    grad = torch.ones(1, 128, dtype=torch.bfloat16)
    options = dict(psum_num_tokens_per_expert=torch.tensor([1], dtype=torch.int32),
                   topk_weights=torch.ones(1), clamp_value=0.0, do_recompute=True, flavor=flavor)
    got = swiglu_backward(x, grad, "bf16", target="cpu", **options)
    want = swiglu_backward(x, grad, "bf16", target="torch", **options)
    for k, (result, expected) in enumerate(zip(got, want, strict=True)):
        assert_bitwise_equal(result, expected, f"output {k}")
