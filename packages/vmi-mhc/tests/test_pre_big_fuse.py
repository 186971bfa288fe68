"""mhc_pre_big_fuse_fwd on the cpu target (both flavors) and on ascend-sim (the ascend flavor).

* The contract of spec §5.1: the fused kernel's three outputs are ``torch.equal`` to the unfused
  chain ``mhc_reduce_partials_and_rmsnorm_fwd`` → ``mhc_pre_split_mixes_fwd`` → ``mhc_sinkhorn_fwd``
  → ``mhc_pre_apply_mix_fwd`` run as kernels on the same target and flavor, and to the reference
  (the same chain of the part-1 references), for ``n = 4`` streams (``n3 = 24``).
* The kernel against a float64 evaluation of the exact formulas, within bounds derived from the
  fp32 roundings of each stage (stated at the test): a check that goes through neither the kernel
  chain nor the fp32 reference.

Kernel specialisations: the fused kernel is specialised on ``(n·H, rms_eps, flavor)``. The default
set uses ``H = 1280`` (two full hidden tiles and a 256-column tail) and ``rms_eps = 1e-6``, the
reduce kernel's default specialisation in ``test_norm_fn``, so the chain's kernels are the ones the
unfused ops' default tests compile: one fused kernel per flavor on cpu. Token counts 0, 1, 37 (a
partial block) and 130 (two blocks and a tail) by default, and ascend-sim runs against the
reference (37 tokens, one and three splits: the Ascend lowering of this kernel alone takes about
10 s); 509,
1021 and 4096 tokens, other hidden sizes, ``n_splits = 1`` on cpu and ascend-sim against the chain
run under ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.cpu_parallel import THREADS_ENV
from vmi_core.tools.testing import REUSE_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_mhc import (
    mhc_pre_apply_mix_fwd,
    mhc_pre_big_fuse_fwd,
    mhc_pre_big_fuse_fwd_parallel,
    mhc_pre_split_mixes_fwd,
    mhc_reduce_partials_and_rmsnorm_fwd,
    mhc_sinkhorn_fwd,
)
from vmi_mhc.reference import pre_big_fuse as reference

N, N3 = 4, 24
HIDDEN = 1280
RMS_EPS, PRE_EPS, SINKHORN_EPS, POST_MULT, REPEAT = 1e-6, 1e-2, 1e-6, 2.0, 10
FLAVORS = ("ascend", "cuda")
TOKENS = (0, 1, 37, 130)
U = 2.0 ** -24  # the fp32 unit roundoff
NAMES = ("post_mix", "comb_mix", "layer_input")


def make_inputs(num_tokens: int, hidden: int, splits: int, seed: int) -> dict:
    """Inputs as the prenorm GEMM would feed the op: a bf16 residual ``N(0, 1) · (1 + 0.01 m)`` (stream
    ``m``), ``fn ~ 1e-2 · N(0, 1)``, the split-K partials of ``x · fnᵀ`` and ``Σ x²`` over ``splits``
    contiguous slices of ``K`` (each exact in float64, then rounded to fp32); gains around
    ``(1.5, -1.5, 1)`` so that the logits spread over a few units. Token 3 (when present) has an
    all-zero residual: zero partials, ``r = 1 / sqrt(eps)``."""
    g = generator(seed)
    streams = 1 + 0.01 * torch.arange(N, dtype=torch.float32).view(1, N, 1)
    residual = (torch.randn(num_tokens, N, hidden, generator=g) * streams).bfloat16()
    if num_tokens > 3:
        residual[3] = 0
    fn = torch.randn(N3, N * hidden, generator=g, dtype=torch.float64) * 1e-2
    x = residual.double().reshape(num_tokens, N * hidden)
    slices = torch.arange(N * hidden).tensor_split(splits)
    return {
        "gemm_out_mul": torch.stack([x[:, k] @ fn[:, k].T for k in slices]).float(),
        "gemm_out_sqrsum": torch.stack([(x[:, k] ** 2).sum(-1) for k in slices]).float(),
        "mhc_scale": torch.randn(3, generator=g) * 0.5 + torch.tensor([1.5, -1.5, 1.0]),
        "mhc_base": torch.randn(N3, generator=g) * 0.5,
        "residual": residual,
    }


def fused(inputs: dict, target: str, flavor: str | None, **kwargs):
    num_tokens, _, hidden = inputs["residual"].shape
    outputs = (torch.full((num_tokens, N), 7.0), torch.full((num_tokens, N * N), 7.0),
               torch.full((num_tokens, hidden), 7.0, dtype=torch.bfloat16))
    results = mhc_pre_big_fuse_fwd(inputs["gemm_out_mul"], inputs["gemm_out_sqrsum"], inputs["mhc_scale"],
                                   inputs["mhc_base"], inputs["residual"], *outputs, RMS_EPS, PRE_EPS, SINKHORN_EPS,
                                   POST_MULT, REPEAT, inputs["gemm_out_mul"].shape[0], target=target, flavor=flavor,
                                   **kwargs)
    assert all(got is given for got, given in zip(results, outputs, strict=True))
    return results


def unfused_chain(inputs: dict, target: str, flavor: str | None):
    """The four part-1 ops, one kernel each, as the training path composes them."""
    partials, sqrsums, residual = inputs["gemm_out_mul"], inputs["gemm_out_sqrsum"], inputs["residual"]
    num_tokens, _, hidden = residual.shape
    _, _, mixes = mhc_reduce_partials_and_rmsnorm_fwd(partials.unsqueeze(2), sqrsums.unsqueeze(2), None, None, None,
                                                      N * hidden, RMS_EPS, partials.shape[0], target=target,
                                                      flavor=flavor)
    pre, post, comb_logits = mhc_pre_split_mixes_fwd(mixes, inputs["mhc_scale"], inputs["mhc_base"], None, None, None,
                                                     POST_MULT, PRE_EPS, target=target, flavor=flavor)
    comb = mhc_sinkhorn_fwd(comb_logits.view(num_tokens, N, N), None, REPEAT, SINKHORN_EPS, target=target,
                            flavor=flavor)
    layer_input = torch.empty((num_tokens, hidden), dtype=torch.bfloat16)
    mhc_pre_apply_mix_fwd(residual, pre, layer_input, target=target, flavor=flavor)
    return post, comb.view(num_tokens, N * N), layer_input


def reference_outputs(inputs: dict, flavor: str):
    return reference.pre_big_fuse_fwd(inputs["gemm_out_mul"], inputs["gemm_out_sqrsum"], inputs["mhc_scale"],
                                      inputs["mhc_base"], inputs["residual"], RMS_EPS, PRE_EPS, SINKHORN_EPS,
                                      POST_MULT, REPEAT, flavor)


def check(flavor: str, target: str, tokens, splits, hidden: int = HIDDEN, *, chain: bool = True) -> None:
    kernel_flavor = None if target == "ascend-sim" else flavor
    for seed, (num_tokens, num_splits) in enumerate((t, s) for t in tokens for s in splits):
        inputs = make_inputs(num_tokens, hidden, num_splits, seed)
        label = f"T={num_tokens} S={num_splits} H={hidden} {flavor} {target}"
        with sim_schedule(REUSE_SCHEDULES[seed % 2]):
            got = fused(inputs, target, kernel_flavor)
        expected = [("reference", reference_outputs(inputs, flavor))]
        if chain:
            expected.append(("chain", unfused_chain(inputs, target, kernel_flavor)))
        for source, wanted in expected:
            for name, actual, want in zip(NAMES, got, wanted, strict=True):
                assert torch.equal(actual, want), f"{name} != the {source} [{label}]"
                assert_bitwise_equal(actual, want, f"{name} vs the {source} [{label}]")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_matches_unfused_chain(flavor: str) -> None:
    check(flavor, "cpu", TOKENS, (16,))


def test_ascend_sim_matches_reference() -> None:
    # One split, then 3 splits (more than the 2 versions of the buffers the split partials pass
    # through) under producers_first and consumers_first, where a missing wait between pipes shows
    # up as wrong data.
    check("ascend", "ascend-sim", (37,), (1, 3, 3), chain=False)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_error_against_float64(flavor: str) -> None:
    # Bounds from the roundings of each stage, per token (u = 2^-24):
    # * mix: S - 1 additions, then r (mean, + eps, sqrt, division: 4 roundings) and the product:
    #   |δmix| <= (S + 5) u · Σ_s |P_s| · r;
    # * logit z = mix · g + b: |δz| <= |g| |δmix| + 2 u (|mix · g| + |z|);
    # * σ(z) (exp, + 1, division) moves by at most |δz| / 4 + 3 u (σ' <= 1/4, σ <= 1); the pre
    #   floor and the post multiplier add one rounding each;
    # * comb: the Sinkhorn projection moves its entries by at most 2 max |δz| over the token's comb
    #   logits (the softmax by at most half of it, the 19 normalisations of matrices with line sums
    #   near 1 at most double it), plus its own fp32 chain (test_sinkhorn: 1e-5 relative, 1e-7);
    # * layer_input: the n-term fp32 stream mix of pre_apply_mix (test_pre_apply_mix's bound) plus
    #   Σ_m |δpre_m| |x_m|, then the bf16 rounding: 2^-8 relative.
    splits = 16
    inputs = make_inputs(130, HIDDEN, splits, 5)
    post, comb, layer_input = fused(inputs, "cpu", flavor)
    exact = reference.pre_big_fuse_fwd_float64(inputs["gemm_out_mul"], inputs["gemm_out_sqrsum"],
                                               inputs["mhc_scale"], inputs["mhc_base"], inputs["residual"], RMS_EPS,
                                               PRE_EPS, SINKHORN_EPS, POST_MULT, REPEAT)
    partials, sqrsums = inputs["gemm_out_mul"].double(), inputs["gemm_out_sqrsum"].double()
    r = 1.0 / torch.sqrt(sqrsums.sum(0) / (N * HIDDEN) + RMS_EPS)
    mix = partials.sum(0) * r.unsqueeze(-1)
    gains = inputs["mhc_scale"].double()[torch.clamp(torch.arange(N3) // N, max=2)]
    z = mix * gains + inputs["mhc_base"].double()
    d_mix = (splits + 5) * U * partials.abs().sum(0) * r.unsqueeze(-1)
    d_z = gains.abs() * d_mix + 2 * U * ((mix * gains).abs() + z.abs())
    d_sigma = d_z / 4 + 3 * U
    assert ((post.double() - exact[0]).abs() <= POST_MULT * (d_sigma[:, N:2 * N] + U)).all()
    comb_bound = 2 * d_z[:, 2 * N:].amax(1, keepdim=True) + 1e-5 * exact[1].abs() + 1e-7
    assert ((comb.double() - exact[1]).abs() <= comb_bound).all()
    x = inputs["residual"].double()
    d_pre = (d_sigma[:, :N] + U * (1 + PRE_EPS)).unsqueeze(-1)
    pre = (torch.sigmoid(z[:, :N]) + PRE_EPS).unsqueeze(-1)
    magnitude = (pre * x).abs().sum(1)
    mixed_bound = N * U * magnitude + (d_pre * x.abs()).sum(1)
    error = (layer_input.double() - exact[2]).abs()
    assert (error <= 2.0 ** -8 * exact[2].abs() + (1 + 2.0 ** -8) * mixed_bound).all()


def test_every_thread_count_gives_the_same_bits(vmi_env) -> None:
    inputs = make_inputs(130, HIDDEN, 16, 7)
    want = fused(inputs, "cpu", "ascend")
    for threads in ("1", "3"):
        vmi_env.setenv(THREADS_ENV, threads)
        for name, got, wanted in zip(NAMES, fused(inputs, "cpu", "ascend"), want, strict=True):
            assert_bitwise_equal(got, wanted, f"{name} [{threads} threads]")


def test_outputs_allocated_when_none() -> None:
    inputs = make_inputs(5, HIDDEN, 16, 8)
    got = mhc_pre_big_fuse_fwd(inputs["gemm_out_mul"], inputs["gemm_out_sqrsum"], inputs["mhc_scale"],
                               inputs["mhc_base"], inputs["residual"], None, None, None, RMS_EPS, PRE_EPS,
                               SINKHORN_EPS, POST_MULT, REPEAT, target="torch", flavor="ascend")
    for name, actual, want in zip(NAMES, got, reference_outputs(inputs, "ascend"), strict=True):
        assert_bitwise_equal(actual, want, name)


def test_zero_tokens_launch_nothing(monkeypatch) -> None:
    from vmi_mhc.kernels import pre_big_fuse as pre_big_fuse_kernel

    def refuse(*args, **kwargs):
        raise AssertionError("no kernel may run for zero tokens")

    monkeypatch.setattr(pre_big_fuse_kernel, "launch", refuse)
    inputs = make_inputs(0, HIDDEN, 16, 9)
    for name, got, shape in zip(NAMES, fused(inputs, "cpu", "ascend"), ((0, N), (0, N * N), (0, HIDDEN)),
                                strict=True):
        assert got.shape == shape, name


def test_parallel_entry_point_refuses_the_reference() -> None:
    inputs = make_inputs(1, HIDDEN, 16, 10)
    with pytest.raises(ValueError, match="always runs the kernel"):
        mhc_pre_big_fuse_fwd_parallel(inputs["gemm_out_mul"], inputs["gemm_out_sqrsum"], inputs["mhc_scale"],
                                      inputs["mhc_base"], inputs["residual"], None, None, None, RMS_EPS, PRE_EPS,
                                      SINKHORN_EPS, POST_MULT, REPEAT, target="torch")


def test_non_finite_partials_stay_in_their_token() -> None:
    # A NaN in a pre entry's partial (token 10) makes that pre weight, hence the whole layer-input
    # row, NaN, and reaches neither post nor comb; an infinite square sum (token 20) gives r = 0 and
    # zero mixes, all finite.
    inputs = make_inputs(37, HIDDEN, 16, 11)
    inputs["gemm_out_mul"][4, 10, 2] = float("nan")
    inputs["gemm_out_sqrsum"][0, 20] = float("inf")
    got = fused(inputs, "cpu", "ascend")
    for name, actual, want in zip(NAMES, got, reference_outputs(inputs, "ascend"), strict=True):
        assert_bitwise_equal(actual, want, name, any_nan=True)
    post, comb, layer_input = got
    assert layer_input[10].isnan().all()
    others = [t for t in range(37) if t != 10]
    assert post.isfinite().all() and comb.isfinite().all() and layer_input[others].isfinite().all()


# --- slow: the spec's token counts, both split counts, other hidden sizes, ascend-sim chains ---

@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
def test_matches_unfused_chain_spec_tokens(flavor: str) -> None:
    check(flavor, "cpu", (509, 1021), (1, 16))


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("hidden", (80, 4160))
def test_matches_unfused_chain_hidden_sizes(flavor: str, hidden: int) -> None:
    check(flavor, "cpu", (37,), (1, 16), hidden)


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
def test_matches_reference_many_tokens(flavor: str) -> None:
    check(flavor, "cpu", (4096 + 17,), (16,), chain=False)


@pytest.mark.slow
def test_ascend_sim_matches_unfused_chain() -> None:
    check("ascend", "ascend-sim", (509,), (1, 16))
