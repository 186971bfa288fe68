"""norm_backward on the cpu and ascend-sim targets, bit for bit against the torch reference
``reference.norm_backward`` (spec quant-b §5), and the reference against float64 autograd.

A case is one row-kernel specialisation (x dtype, hidden size, weight, residual gradient,
out_scale, flavor) and the weight gradient's buffer: ``None`` (no weight), ``"new"`` (allocated
by the op) or the dtype of an accumulation buffer. The token count is a runtime value: each case
runs 0 rows, 1 row, a partial work tile and a partial row block (37), and several row blocks with
a partial last tile (101). The default set is a covering set; the full product runs under
``slow``. ascend-sim runs one case by default (a hidden size with a masked register tail,
several row blocks over the 64 cores), the ascend-flavor ones under ``slow``; the other tests reuse
the first case's kernels.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import REUSE_SCHEDULES, assert_bitwise_equal, randn, sim_schedule
from vmi_devkit.cases.norm_backward_cases import COVERING, DTYPES, EPS, FULL, case_id
from vmi_devkit.errors import forbid_kernels
from vmi_quant import reference
from vmi_quant.ops.norm_backward import norm_backward, norm_backward_parallel

TOKENS = (0, 1, 37, 101)


SIM_COVERING = [COVERING[0]]
SIM_FULL = [c for c in FULL if c[5] == "ascend" and c not in SIM_COVERING]


def rms_rstd(x: torch.Tensor) -> torch.Tensor:
    """The forward's saved rstd: fp32 ``1 / sqrt(mean(x^2) + eps)``."""
    return torch.rsqrt(x.double().square().mean(-1) + EPS).float()


def make_inputs(case, num_tokens: int, seed: int) -> dict:
    dtype, hidden, weight_grad, residual, _, _ = case
    x = randn((num_tokens, hidden), seed, DTYPES[dtype])
    inputs = {
        "out_grad": randn((num_tokens, hidden), seed + 1, DTYPES[dtype]),
        "x": x,
        "weight": None if weight_grad is None else randn((hidden,), seed + 2, DTYPES[dtype]),
        "rstd": rms_rstd(x),
        "residual_out_grad": randn((num_tokens, hidden), seed + 3, DTYPES[dtype]) if residual else None,
    }
    if weight_grad in DTYPES:
        inputs["weight_grad"] = randn((hidden,), seed + 4, DTYPES[weight_grad])
    return inputs


def check_case(case, tokens=TOKENS, *, target=None, schedules=("consumers_first",)) -> None:
    """Each token count against one reference, one launch per ascend-sim pipe schedule."""
    *_, out_scale, flavor = case
    for seed, num_tokens in enumerate(tokens):
        inputs = make_inputs(case, num_tokens, seed)
        want_x_grad, want_weight_grad = reference.norm_backward(**inputs, out_scale=out_scale, flavor=flavor)
        buffer = inputs.get("weight_grad")
        for schedule in schedules:
            given = None if buffer is None else buffer.clone()
            with sim_schedule(schedule):
                x_grad, weight_grad = norm_backward(**{**inputs, "weight_grad": given}, out_scale=out_scale,
                                                    target=target, flavor=None if target == "ascend-sim" else flavor)
            label = f"{case_id(case)} T={num_tokens} target={target} schedule={schedule}"
            assert_bitwise_equal(x_grad, want_x_grad, f"x_grad [{label}]")
            if inputs["weight"] is None:
                assert weight_grad is None, label
                continue
            assert_bitwise_equal(weight_grad, want_weight_grad, f"weight_grad [{label}]")
            if given is not None:
                assert weight_grad is given, f"the accumulation buffer is returned [{label}]"


@pytest.mark.parametrize("case", COVERING, ids=case_id)
def test_matches_reference(case):
    check_case(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in FULL if c not in COVERING], ids=case_id)
def test_matches_reference_full(case):
    check_case(case, (0, 1, 37, 101, 1000))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_largest_hidden_size(dtype):
    check_case((dtype, 8192, "new", True, 0.3, "ascend"), (1, 37))


@pytest.mark.parametrize("case", SIM_COVERING, ids=case_id)
def test_matches_reference_on_ascend_sim(case):
    # One pair of kernels (their build is the cost): several token counts, then strided rows. At
    # T=101 cores reuse buffer versions (4 inner tiles of x / out_grad / residual_out_grad / x_grad
    # on 2 versions), so each count runs under both schedules that expose a missing wait
    # (consumers first: read-after-write; producers first: write-after-read).
    check_case(case, (1, 101), target="ascend-sim", schedules=REUSE_SCHEDULES)
    check_strided_rows(case, target="ascend-sim")


@pytest.mark.slow
@pytest.mark.parametrize("case", SIM_FULL, ids=case_id)
def test_matches_reference_on_ascend_sim_full(case):
    check_case(case, (1, 37, 600), target="ascend-sim")


def check_strided_rows(case, *, target=None):
    # Unit stride along H, padded row strides (different for each tensor).
    dtype, hidden, buffer_dtype, _, out_scale, _ = case
    rows = 70
    x = randn((rows, hidden + 64), 5, DTYPES[dtype])[:, :hidden]
    out_grad = randn((rows, hidden + 32), 6, DTYPES[dtype])[:, 32:]
    residual_out_grad = randn((rows, 2 * hidden), 7, DTYPES[dtype])[:, hidden:]
    weight, rstd = randn((hidden,), 8, DTYPES[dtype]), rms_rstd(x)
    buffer = randn((hidden,), 9, DTYPES[buffer_dtype])
    assert not (x.is_contiguous() or out_grad.is_contiguous() or residual_out_grad.is_contiguous())
    x_grad, weight_grad = norm_backward(out_grad, x, weight, rstd, residual_out_grad, out_scale, buffer.clone(),
                                        target=target)
    want = reference.norm_backward(out_grad.contiguous(), x.contiguous(), weight, rstd,
                                   residual_out_grad.contiguous(), out_scale, buffer)
    assert_bitwise_equal(x_grad, want[0], f"x_grad [{target}]")
    assert_bitwise_equal(weight_grad, want[1], f"weight_grad [{target}]")


def test_strided_rows():
    check_strided_rows(COVERING[0])


def test_every_thread_count_gives_the_same_bits(vmi_env):
    # The weight gradient's order depends on T only (blocks of 32 rows): one thread and four
    # threads (row blocks split across them) agree, and equal the reference. COVERING[0]'s kernel.
    case = COVERING[0]
    inputs = make_inputs(case, 300, 11)
    results = []
    for threads in ("1", "4"):
        vmi_env.setenv("VMI_CPU_THREADS", threads)
        results.append(norm_backward(**{**inputs, "weight_grad": inputs["weight_grad"].clone()}, out_scale=case[4]))
    want = reference.norm_backward(**inputs, out_scale=case[4])
    for x_grad, weight_grad in results:
        assert_bitwise_equal(x_grad, want[0], "x_grad")
        assert_bitwise_equal(weight_grad, want[1], "weight_grad")


def test_no_tokens_launch_nothing(monkeypatch):
    forbid_kernels(monkeypatch, why="T == 0")
    x = torch.empty(0, 256, dtype=torch.bfloat16)
    weight = torch.ones(256, dtype=torch.bfloat16)
    x_grad, weight_grad = norm_backward(x, x, weight, torch.empty(0))
    assert x_grad.shape == (0, 256) and x_grad.dtype == torch.bfloat16
    assert weight_grad.dtype == torch.bfloat16 and torch.equal(weight_grad, torch.zeros(256, dtype=torch.bfloat16))
    buffer = torch.tensor([-0.0, float("nan")] * 128)
    before = buffer.clone()
    for target in (None, "torch"):
        _, weight_grad = norm_backward(x, x, weight, torch.empty(0), weight_grad=buffer, target=target)
        assert weight_grad is buffer
        assert_bitwise_equal(buffer, before, f"untouched buffer [{target}]")


def test_non_finite_values_propagate():
    # A NaN in x (row 3), +inf in out_grad (row 5) and in rstd (row 8), a NaN in the residual
    # gradient (row 9): those rows' x_grad, and the weight gradient's columns, follow IEEE
    # arithmetic as the reference does (NaN payloads aside). COVERING[0]'s kernel.
    case = COVERING[0]
    inputs = make_inputs(case, 40, 12)
    inputs["x"][3, 10] = float("nan")
    inputs["out_grad"][5, 20] = float("inf")
    inputs["rstd"][8] = float("inf")
    inputs["residual_out_grad"][9, 30] = float("nan")
    x_grad, weight_grad = norm_backward(**{**inputs, "weight_grad": inputs["weight_grad"].clone()}, out_scale=case[4])
    want_x_grad, want_weight_grad = reference.norm_backward(**inputs, out_scale=case[4])
    assert_bitwise_equal(x_grad, want_x_grad, "x_grad", any_nan=True)
    assert_bitwise_equal(weight_grad, want_weight_grad, "weight_grad", any_nan=True)
    bad = ~x_grad.float().isfinite()
    assert bad[[3, 5, 8]].any(1).all() and bad[9].sum() == 1
    assert not bad[[0, 1, 2, 4, 6, 7, 10]].any()
    # Row 8's infinite rstd makes every xh of the row infinite (x is never 0 here).
    assert weight_grad[10].isnan() and not weight_grad.float().isfinite().any()


def _autograd_reference(out_grad, x, weight, residual_out_grad, out_scale):
    """float64 gradients of ``y = x * rsqrt(mean(x^2) + eps) * w * out_scale`` (+ the residual's
    gradient), by torch.autograd."""
    x64 = x.double().requires_grad_(True)
    w64 = weight.double().requires_grad_(True)
    y = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + EPS) * w64 * out_scale
    y.backward(out_grad.double())
    return x64.grad + residual_out_grad.double(), w64.grad


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_reference_against_float64_autograd(dtype):
    # x_grad within torch's default tolerances of its dtype (the dtype's rounding of a value off by a
    # few fp32 ulp); the weight gradient within the spec's bounds (§5.4: atol 2e-3 / sqrt(P), rtol
    # 1e-4 fp32, 8e-3 bf16) for P = 1: the float64 sum uses the same fp32 rstd.
    torch.manual_seed(0)
    hidden, rows, out_scale = 2048, 256, 0.3
    x = randn((rows, hidden), 21, DTYPES[dtype])
    out_grad = randn((rows, hidden), 22, DTYPES[dtype])
    residual_out_grad = randn((rows, hidden), 23, DTYPES[dtype])
    weight = randn((hidden,), 24, DTYPES[dtype])
    rstd = rms_rstd(x)
    x_grad, weight_grad = norm_backward(out_grad, x, weight, rstd, residual_out_grad, out_scale, target="torch")
    want_x_grad, _ = _autograd_reference(out_grad, x, weight, residual_out_grad, out_scale)
    want_weight_grad = (x.double() * rstd.double()[:, None] * out_grad.double() * float(torch.tensor(out_scale))).sum(0)
    torch.testing.assert_close(x_grad, want_x_grad.to(x_grad.dtype))
    torch.testing.assert_close(weight_grad.double(), want_weight_grad, atol=2e-3,
                               rtol=8e-3 if dtype == "bf16" else 1e-4)


def test_new_weight_grad():
    # Without a buffer: a new x-dtype gradient (the op adds it to zeros, which leaves its bits).
    case = COVERING[0]
    inputs = make_inputs(case, 37, 32)
    del inputs["weight_grad"]
    x_grad, weight_grad = norm_backward(**inputs, out_scale=case[4])
    want = reference.norm_backward(**inputs, out_scale=case[4])
    assert_bitwise_equal(x_grad, want[0], "x_grad")
    assert_bitwise_equal(weight_grad, want[1], "weight_grad")
    assert weight_grad.dtype == inputs["x"].dtype


def test_torch_target_and_parallel_entry_point():
    case = COVERING[0]
    inputs = make_inputs(case, 37, 30)
    want = reference.norm_backward(**inputs, out_scale=case[4])
    for entry, target in ((norm_backward, "torch"), (norm_backward_parallel, None)):
        got = entry(**{**inputs, "weight_grad": inputs["weight_grad"].clone()}, out_scale=case[4], target=target)
        for name, a, b in zip(("x_grad", "weight_grad"), got, want, strict=True):
            assert_bitwise_equal(a, b, f"{name} [{entry.__name__} {target}]")
    with pytest.raises(ValueError, match="target 'torch'"):
        norm_backward_parallel(**inputs, out_scale=case[4], target="torch")


def test_custom_op_writes_weight_grad_in_place():
    # torch.ops.vmi.norm_backward returns x_grad and adds the weight gradient to weight_grad (a
    # mutable argument), bumping its version counter. COVERING[0]'s kernel.
    case = COVERING[0]
    inputs = make_inputs(case, 37, 31)
    buffer = inputs["weight_grad"].clone()
    version = buffer._version
    x_grad = torch.ops.vmi.norm_backward(inputs["out_grad"], inputs["x"], inputs["weight"], inputs["rstd"],
                                         inputs["residual_out_grad"], case[4], buffer)
    want = reference.norm_backward(**inputs, out_scale=case[4])
    assert_bitwise_equal(x_grad, want[0], "x_grad")
    assert_bitwise_equal(buffer, want[1], "weight_grad")
    assert buffer._version > version
