"""mhc_sinkhorn_fwd and mhc_sinkhorn_bwd on the cpu target (both flavors) and on ascend-sim (the
ascend flavor, its only one) against the reference, bit for bit; and against float64 evaluations
of the formula within stated bounds.

Bitwise: kernel and reference evaluate the same fp32 chain, every step one rounding (sums of 4 in
the flavor's tree, a correctly rounded exp, the flavor's division), so there is no tolerance.
Independently of the reference: the spec's worked examples, the large same-sign logits case
(spec §3.9.5), the flavors' subnormal quotients, the NaN/Inf policy, the float64 recompute backward
checked against autograd and by gradcheck. ``repeat`` and ``eps`` are kernel arguments, so the
default run compiles one forward and one backward kernel per flavor (cpu) and the backward on
ascend-sim (the forward's there in the slow run); token counts cover 0, 1 and a 64-token tile with
a tail, and on ascend-sim 8193 (3 tiles on a core) under two pipe schedules.
"""

import pytest
import torch

from vmi_core.cpu_parallel import THREADS_ENV, row_ranges
from vmi_core.fp32 import flush_subnormal
from vmi_core.tools.testing import REUSE_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_mhc import mhc_sinkhorn_bwd, mhc_sinkhorn_bwd_parallel, mhc_sinkhorn_fwd, mhc_sinkhorn_fwd_parallel
from vmi_mhc.kernels.sinkhorn import BLOCK_T, MAX_BACKWARD_REPEAT
from vmi_mhc.ops.sinkhorn import MHC_SINKHORN_BWD, MHC_SINKHORN_FWD
from vmi_mhc.reference import sinkhorn as reference

FLAVORS = ("ascend", "cuda")
CPU = [(flavor, "cpu") for flavor in FLAVORS]
SIM = [("ascend", "ascend-sim")]
# (repeat, eps): the model's, one iteration, the longest backward, no eps.
SETTINGS = [(10, 1e-6), (1, 1e-2), (MAX_BACKWARD_REPEAT, 0.0)]
TOKENS = [0, 1, BLOCK_T + 6]


def matrices(num_tokens: int, seed: int, scale: float = 1.0, *,
             spread: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (``randn * scale``; with ``spread``, some tokens with ties and some with rows spread so
    far that fp32 exp underflows) and output gradients."""
    g = generator(seed)
    logits = torch.randn(num_tokens, 4, 4, generator=g) * scale
    if num_tokens and spread:
        logits[::7] = logits[::7].round()
        logits[3::11] *= 30.0
    return logits, torch.randn(num_tokens, 4, 4, generator=g)


def run_both(logits, grad, repeat, eps, flavor, target):
    flavor_arg = flavor if target == "cpu" else None
    out = mhc_sinkhorn_fwd(logits, torch.empty_like(logits), repeat, eps, target=target, flavor=flavor_arg)
    grad_input = mhc_sinkhorn_bwd(grad, logits, torch.empty_like(logits), repeat, eps, target=target,
                                  flavor=flavor_arg)
    return out, grad_input


def check_against_reference(logits, grad, repeat, eps, flavor, target, what):
    out, grad_input = run_both(logits, grad, repeat, eps, flavor, target)
    assert_bitwise_equal(out, reference.sinkhorn_forward(logits, repeat, eps, flavor), f"{what} forward")
    assert_bitwise_equal(grad_input, reference.sinkhorn_backward(grad, logits, repeat, eps, flavor),
                         f"{what} backward")
    return out, grad_input


@pytest.mark.parametrize(("flavor", "target"), CPU + [pytest.param(*SIM[0], marks=pytest.mark.slow)])
def test_matches_reference(flavor: str, target: str) -> None:
    for seed, num_tokens in enumerate(TOKENS):
        for repeat, eps in SETTINGS:
            logits, grad = matrices(num_tokens, seed)
            check_against_reference(logits, grad, repeat, eps, flavor, target,
                                    f"T={num_tokens} repeat={repeat} eps={eps}")


# Tokens whose backward divides values below 2^-100 (probabilities of about e^-70): there the
# Ascend vector division's residual check (TileLang's vdiv_0ulp_ftz_true) sees underflowing
# residuals and moves some quotients by an ulp from the flushed, correctly rounded quotient.
UNDERFLOW_LOGITS = torch.tensor([[[80, 9, 50, -60], [-5, 67, 81, 62], [79, 26, 59, 46], [80, 1, 82, -26]],
                                 [[12, -2, -74, -31], [45, -39, 8, -62], [-29, -86, -23, -53], [85, 60, 35, 83]]],
                                dtype=torch.float32)
UNDERFLOW_GRAD = torch.tensor([[[7, -7, 8, 3], [4, -7, -8, 8], [-7, 7, 7, 7], [2, 8, -4, 6]],
                               [[-4, 8, 3, 0], [-7, 0, -2, 2], [5, -5, 0, 1], [-8, -8, 4, 3]]],
                              dtype=torch.float32) / 4


def test_ascend_division_with_underflowing_residuals(monkeypatch) -> None:
    """The ascend flavor models the vector division's residual check (the cuda flavor is IEEE): on
    these tokens it changes the gradient's bits, and the cpu kernel gives the reference's."""
    expected = reference.sinkhorn_backward(UNDERFLOW_GRAD, UNDERFLOW_LOGITS, 10, 1e-6, "ascend")
    grad_input = mhc_sinkhorn_bwd(UNDERFLOW_GRAD, UNDERFLOW_LOGITS, None, 10, 1e-6, target="cpu", flavor="ascend")
    assert_bitwise_equal(grad_input, expected, "ascend flavor")

    def flushed_quotient(numerator, denominator, flavor):
        return flush_subnormal(flush_subnormal(numerator) / flush_subnormal(denominator))

    monkeypatch.setattr(reference, "divide", flushed_quotient)
    without_check = reference.sinkhorn_backward(UNDERFLOW_GRAD, UNDERFLOW_LOGITS, 10, 1e-6, "ascend")
    changed = (without_check.view(torch.int32) != expected.view(torch.int32)).flatten(1).any(dim=1)
    assert bool(changed.all()), "the tokens no longer exercise the residual check"
    assert bool(((without_check - expected).abs() <= expected.abs() * 2**-23).all())


@pytest.mark.parametrize(("flavor", "target"), SIM)
def test_ascend_sim_backward(flavor: str, target: str) -> None:
    """The default run's ascend-sim case: the backward kernel, whose replay runs the forward's 4x4
    chain (``vmi_mhc.tl.sinkhorn``, the same code as the forward kernel's) on the simulator too.
    The forward kernel's own build joins it in the slow run (``test_matches_reference``): each
    simulator build is a C++ compile of the whole emitted kernel. With the tokens whose divisions
    take the residual check's other branch."""
    cases = [(matrices(num_tokens, seed), repeat, eps) for seed, num_tokens in enumerate(TOKENS)
             for repeat, eps in SETTINGS]
    for (logits, grad), repeat, eps in [*cases, ((UNDERFLOW_LOGITS, UNDERFLOW_GRAD), 10, 1e-6)]:
        grad_input = mhc_sinkhorn_bwd(grad, logits, None, repeat, eps, target=target)
        assert_bitwise_equal(grad_input, reference.sinkhorn_backward(grad, logits, repeat, eps, flavor),
                             f"T={logits.shape[0]} repeat={repeat} eps={eps}")
    # 129 tiles of BLOCK_T tokens: core 0 runs 3, more than its 2 buffer versions; under
    # consumers_first and producers_first a missing wait between pipes shows up as wrong data.
    (logits, grad), (repeat, eps) = matrices(128 * BLOCK_T + 1, len(TOKENS)), SETTINGS[1]
    want = reference.sinkhorn_backward(grad, logits, repeat, eps, flavor)
    for schedule in REUSE_SCHEDULES:
        with sim_schedule(schedule):
            grad_input = mhc_sinkhorn_bwd(grad, logits, None, repeat, eps, target=target)
        assert_bitwise_equal(grad_input, want, f"T={logits.shape[0]} repeat={repeat} eps={eps} schedule={schedule}")


# Bounds against float64 (measured on 8192 tokens of randn and 4 * randn logits, R = 1, 10, 16:
# forward at most 2.1e-6 relative, about 30 ulp; backward at most 1.7e-7 of the token's largest
# output gradient). Each of the 2R - 1 normalisations rounds its 4-term sum (3 adds), the + eps
# and the quotient, about 5 ulp of its output, and passes earlier errors on with a gain of order
# one (each output is a ratio of a value to a sum that contains it): 31 steps at R = 16 give some
# 160 ulp, 1e-5 relative, in the worst case. The backward rounds about 6 times per step (products,
# sum, quotient, difference, quotient) on values of the output gradient's scale: 31 x 6 x 2^-24
# is 1.1e-5 of it.
FORWARD_RTOL, FORWARD_ATOL = 1e-5, 1e-7
BACKWARD_RTOL = 1.1e-5


@pytest.mark.parametrize(("flavor", "target"), CPU)
def test_error_against_float64(flavor: str, target: str) -> None:
    for seed, scale in enumerate((1.0, 4.0)):
        logits, grad = matrices(1000, 10 + seed, scale, spread=False)
        for repeat, eps in SETTINGS:
            out, grad_input = run_both(logits, grad, repeat, eps, flavor, target)
            torch.testing.assert_close(out.double(), reference.sinkhorn_forward_float64(logits, repeat, eps),
                                       rtol=FORWARD_RTOL, atol=FORWARD_ATOL)
            exact = reference.sinkhorn_backward_float64(grad, logits, repeat, eps)
            scale_of_token = grad.double().abs().amax(dim=(1, 2), keepdim=True)
            assert bool(((grad_input.double() - exact).abs() <= BACKWARD_RTOL * scale_of_token).all())


LARGE_LOGITS = torch.tensor([[0.0, 1.0, 2.0, 3.0], [3.0, 1.0, 2.0, 0.0], [1.5, 0.5, 3.5, 2.5],
                             [2.5, 3.5, 0.5, 1.5]])
LARGE_GRAD = torch.tensor([[0.5, -1.0, 0.25, 2.0], [-0.75, 1.5, -2.0, 0.125], [1.0, 0.0, -0.5, -1.25],
                           [0.375, -0.625, 1.75, -1.5]])


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
@pytest.mark.parametrize("offset", [100.0, -100.0])
@pytest.mark.parametrize(("flavor", "target"), CPU)
def test_large_same_sign_logits(flavor: str, target: str, offset: float, eps: float) -> None:
    """Spec §3.9.5: the max subtraction keeps logits offset by +-100 finite and accurate."""
    logits, grad = (LARGE_LOGITS + offset).unsqueeze(0), LARGE_GRAD.unsqueeze(0)
    out, grad_input = run_both(logits, grad, 10, eps, flavor, target)
    assert bool(out.isfinite().all()) and bool(grad_input.isfinite().all())
    # The spec's tolerance for this case (TileKernels' test): fp32 steps against float64.
    torch.testing.assert_close(out.double(), reference.sinkhorn_forward_float64(logits, 10, eps), rtol=1e-5,
                               atol=1e-6)
    torch.testing.assert_close(grad_input.double(), reference.sinkhorn_backward_float64(grad, logits, 10, eps),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("flavor", "target"), CPU)
def test_worked_examples(flavor: str, target: str) -> None:
    """Spec §3.9.2 (repeat 10, eps 1e-6): zero logits give 0.24999976 everywhere, ``5 I`` a diagonal
    of 0.980183 and 0.006605 elsewhere, and the sums of the columns are 0.999999."""
    logits = torch.stack([torch.zeros(4, 4), 5.0 * torch.eye(4)])
    out = mhc_sinkhorn_fwd(logits, None, 10, 1e-6, target=target, flavor=flavor)
    torch.testing.assert_close(out[0], torch.full((4, 4), 0.24999976), rtol=0, atol=1e-8)
    eye = torch.eye(4, dtype=torch.bool)
    torch.testing.assert_close(out[1][eye], torch.full((4,), 0.980183), rtol=0, atol=1e-6)
    torch.testing.assert_close(out[1][~eye], torch.full((12,), 0.006605), rtol=0, atol=1e-6)
    torch.testing.assert_close(out.sum(dim=1), torch.full((2, 4), 0.999999), rtol=0, atol=1e-6)


@pytest.mark.parametrize(("flavor", "target"), CPU)
def test_subnormal_quotients(flavor: str, target: str) -> None:
    """With eps = 0, exp(-100) / 1 is subnormal: the cuda flavor keeps it through every (IEEE)
    division, the ascend flavor's division flushes it to +0.0."""
    logits = torch.full((1, 4, 4), -100.0)
    logits[0].fill_diagonal_(0.0)
    out = mhc_sinkhorn_fwd(logits, None, 2, 0.0, target=target, flavor=flavor)
    off_diagonal = out[0][~torch.eye(4, dtype=torch.bool)]
    if flavor == "ascend":
        assert bool((off_diagonal.view(torch.int32) == 0).all())
    else:
        tiny = torch.finfo(torch.float32).tiny
        assert bool(((off_diagonal > 0) & (off_diagonal < tiny)).all())
    assert bool((out[0].diagonal() == 1.0).all())


@pytest.mark.parametrize(("flavor", "target"), CPU)
def test_nonfinite_values(flavor: str, target: str) -> None:
    """A -inf logit gets probability 0; a NaN, a +inf or a row of -inf makes the token's matrix NaN;
    a NaN output gradient makes the token's gradient NaN. Other tokens are unaffected."""
    logits, grad = matrices(6, 3)
    logits[1, 2, 1] = float("-inf")
    logits[2, 0, 3] = float("nan")
    logits[3, 1, 1] = float("inf")
    logits[4, 3] = float("-inf")
    grad[5, 2, 2] = float("nan")
    out, grad_input = run_both(logits, grad, 10, 1e-6, flavor, target)
    assert bool(out[[0, 1, 5]].isfinite().all()) and bool(grad_input[[0, 1]].isfinite().all())
    assert float(out[1, 2, 1]) < 1e-5 and float(grad_input[1, 2, 1]) == 0.0
    assert bool(out[2:5].isnan().all()) and bool(grad_input[2:6].isnan().all())
    finite = [0, 1]
    assert_bitwise_equal(out[finite], reference.sinkhorn_forward(logits, 10, 1e-6, flavor)[finite], "finite forward")
    assert_bitwise_equal(grad_input[finite], reference.sinkhorn_backward(grad, logits, 10, 1e-6, flavor)[finite],
                         "finite backward")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_split_over_threads(flavor: str, vmi_env) -> None:
    vmi_env.setenv(THREADS_ENV, "3")
    num_tokens = 700
    assert len(row_ranges(num_tokens, 3, BLOCK_T, 32)) >= 2
    logits, grad = matrices(num_tokens, 5)
    out, grad_input = check_against_reference(logits, grad, 10, 1e-6, flavor, "cpu", "split")
    vmi_env.setenv(THREADS_ENV, "1")
    one_out, one_grad = run_both(logits, grad, 10, 1e-6, flavor, "cpu")
    assert_bitwise_equal(one_out, out, "one thread forward")
    assert_bitwise_equal(one_grad, grad_input, "one thread backward")


def test_entry_points_agree() -> None:
    logits, grad = matrices(BLOCK_T + 6, 6)
    given = torch.empty_like(logits)
    out = mhc_sinkhorn_fwd(logits, given, 10, 1e-6, target="cpu")
    assert out is given
    given_grad = torch.empty_like(logits)
    grad_input = mhc_sinkhorn_bwd(grad, logits, given_grad, 10, 1e-6, target="cpu")
    assert grad_input is given_grad
    forwards = {
        "parallel": mhc_sinkhorn_fwd_parallel(logits, torch.empty_like(logits), 10, 1e-6, target="cpu"),
        "allocated": mhc_sinkhorn_fwd(logits, None, 10, 1e-6, target="cpu"),
        "custom op": MHC_SINKHORN_FWD.default(logits, 10, 1e-6, target="cpu"),
        "torch": mhc_sinkhorn_fwd(logits, None, 10, 1e-6, target="torch"),
    }
    backwards = {
        "parallel": mhc_sinkhorn_bwd_parallel(grad, logits, torch.empty_like(logits), 10, 1e-6, target="cpu"),
        "allocated": mhc_sinkhorn_bwd(grad, logits, None, 10, 1e-6, target="cpu"),
        "custom op": MHC_SINKHORN_BWD.default(grad, logits, 10, 1e-6, target="cpu"),
        "torch": mhc_sinkhorn_bwd(grad, logits, None, 10, 1e-6, target="torch"),
    }
    for what, value in forwards.items():
        assert_bitwise_equal(value, out, what)
    for what, value in backwards.items():
        assert_bitwise_equal(value, grad_input, what)
    fresh_logits, fresh_grad = matrices(BLOCK_T + 6, 6)
    assert_bitwise_equal(logits, fresh_logits, "logits unchanged")
    assert_bitwise_equal(grad, fresh_grad, "output gradient unchanged")


def test_zero_tokens_launch_nothing() -> None:
    empty = torch.empty(0, 4, 4)
    assert mhc_sinkhorn_fwd(empty, None, 10, 1e-6, target="cpu").shape == (0, 4, 4)
    assert mhc_sinkhorn_bwd(empty, empty, None, 10, 1e-6, target="cpu").shape == (0, 4, 4)


class _Float64Sinkhorn(torch.autograd.Function):
    """The float64 forward with the float64 recompute backward of spec §3.9.3."""

    @staticmethod
    def forward(ctx, logits, repeat, eps):
        ctx.save_for_backward(logits)
        ctx.repeat, ctx.eps = repeat, eps
        return reference.sinkhorn_forward_float64(logits, repeat, eps)

    @staticmethod
    def backward(ctx, grad):
        (logits,) = ctx.saved_tensors
        return reference.sinkhorn_backward_float64(grad, logits, ctx.repeat, ctx.eps), None, None


def test_float64_recompute_backward_is_the_gradient() -> None:
    logits, grad = matrices(64, 7, 2.0)
    for repeat, eps in [(1, 1e-2), (3, 1e-6), (10, 0.0)]:
        x = logits.double().requires_grad_()
        (autograd,) = torch.autograd.grad(reference.sinkhorn_forward_float64(x, repeat, eps), x, grad.double())
        torch.testing.assert_close(reference.sinkhorn_backward_float64(grad, logits, repeat, eps), autograd,
                                   rtol=1e-12, atol=1e-14)
    small = logits[:3].double().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: _Float64Sinkhorn.apply(t, 3, 1e-2), (small,))


# --- slow sweeps ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("flavor", "target"), CPU)
def test_matches_reference_full(flavor: str, target: str) -> None:
    for seed, num_tokens in enumerate([BLOCK_T - 1, BLOCK_T, 4096 + 37]):
        for repeat in range(1, MAX_BACKWARD_REPEAT + 1, 5):
            logits, grad = matrices(num_tokens, 100 + seed, 1.0 + seed)
            check_against_reference(logits, grad, repeat, 1e-6 * seed, flavor, target, f"T={num_tokens} R={repeat}")


@pytest.mark.slow
@pytest.mark.parametrize(("flavor", "target"), SIM)
def test_ascend_sim_full(flavor: str, target: str) -> None:
    # More tiles than the 64 simulated cores, so each core loops over several.
    logits, grad = matrices(64 * BLOCK_T * 2 + 5, 200, 2.0)
    check_against_reference(logits, grad, 10, 1e-6, flavor, target, "wrapping")
    for offset in (100.0, -100.0):
        check_against_reference((LARGE_LOGITS + offset).unsqueeze(0), LARGE_GRAD.unsqueeze(0), 10, 1e-2, flavor,
                                target, f"offset {offset}")
    nonfinite = torch.tensor([[0.0, float("-inf"), 1.0, 2.0]]).expand(4, 4).unsqueeze(0).contiguous()
    check_against_reference(nonfinite, LARGE_GRAD.unsqueeze(0), 3, 1e-6, flavor, target, "-inf")
