"""The mHC autograd layer (``vmi_mhc.autograd``, ``vmi_mhc.functional``; spec §1.2, §1.3, §4).

* Gradients of every Function, of ``mhc_pre`` + ``mhc_post`` and of ``mhc_head`` against
  ``torch.autograd`` through the float64 composition ``vmi_mhc.reference.functional``, normwise:
  ``max |kernel - exact| <= bound · max |exact|`` per tensor. The bounds come from the roundings
  the kernels do and the exact formula does not (see ``BOUNDS``).
* The residual's gradient is, bit for bit, the three-stage accumulation of spec §1.3 done by hand
  with the kernel-level entry points (post's fresh ``d_residual``, then the pre_apply_mix and the
  prenorm GEMM backward accumulating into it), and so are every parameter's gradients.
* Repeated backward (``retain_graph``), a partial backward first, a residual that another op also
  consumes, detached mixes, ``mhc_head`` without a post, zero tokens; ``torch.no_grad`` /
  ``torch.inference_mode`` take ``mhc_pre_big_fuse_fwd`` (a spy on the entry point proves it) and
  agree with the training path within spec §4's 1e-4.

The plumbing is target-independent, so the default set runs it on the ``torch`` target (the
reference, no compiles) and only the two Functions of the residual protocol that have a kernel of
their own, ``mhc_pre_apply_mix`` and ``mhc_post``, on ``cpu`` kernels (two tests of two compiles); the whole
layer and every Function on ``cpu`` in both flavors, 4096 tokens and ``ascend-sim`` run under
``slow``.
"""

from __future__ import annotations

import pytest
import torch

import vmi_mhc.functional as functional
from vmi_core.tools.testing import assert_bitwise_equal, randn
from vmi_mhc import (
    expand_to_mhc,
    mhc_fn_normw_merge_bwd,
    mhc_fn_normw_merge_fwd,
    mhc_head,
    mhc_head_compute_mix,
    mhc_head_compute_mix_bwd,
    mhc_head_compute_mix_fwd,
    mhc_post,
    mhc_post_bwd,
    mhc_post_fwd,
    mhc_pre,
    mhc_pre_apply_mix,
    mhc_pre_apply_mix_bwd,
    mhc_pre_apply_mix_fwd,
    mhc_pre_norm_fn,
    mhc_pre_norm_fn_gemm_bwd,
    mhc_pre_norm_fn_gemm_fwd,
    mhc_pre_split_mixes,
    mhc_pre_split_mixes_bwd,
    mhc_pre_split_mixes_fwd,
    mhc_reduce_partials_and_rmsnorm_bwd,
    mhc_reduce_partials_and_rmsnorm_fwd,
    mhc_sinkhorn_bwd,
    mhc_sinkhorn_fwd,
    sinkhorn_normalize,
)
from vmi_mhc.reference import functional as exact

N, HIDDEN = 4, 64  # K = 256: the prenorm GEMM backward needs K % 256 == 0
K, N3 = N * HIDDEN, N * (N + 2)
SPLITS = 4  # K / 4 = 64 columns a split
LEAD = (2, 35)  # 70 tokens: a 64-token tile and a tail (the kernels)
FEW = (2, 3)  # the plumbing on the torch target (its prenorm GEMM reference loops over tokens)
OPTIONS = {"norm_eps": 1e-6, "post_mult_value": 2.0, "pre_eps": 1e-2, "sinkhorn_eps": 1e-6, "sinkhorn_repeat": 10}
FLAVORS = ("ascend", "cuda")

# Bounds against the float64 composition, normwise (max |kernel - exact| <= bound · max |exact|),
# from the roundings the kernels do and it does not:
# - bf16 results and gradients (layer input, next residual, residual and hidden gradients): one
#   bf16 store is relative 2^-9; the residual gradient is rounded three times (post, pre_apply_mix,
#   norm_fn) and its partial sums can exceed the final value: 2^-6;
# - the mixes downstream of the prenorm GEMM: its operand fn_eff is rounded to TF32 (relative 2^-11)
#   and the fp32 steps after it carry that on: 2^-8;
# - gradients of the mixes and the parameters in the layer: the bf16 gradient of the sublayer input
#   (relative 2^-9 per element) and the TF32 mixes' gradient (2^-11) enter them through sums over H
#   and over tokens whose terms cancel, which magnifies the relative error by the ratio of the
#   terms' magnitudes to the sum's: measured up to 7.8e-3 (the gains' gradient, 70 tokens), bound
#   2^-5 (a wrong protocol, e.g. a lost contribution, is off by O(1));
# - pure fp32 chains on exact inputs (Sinkhorn, split, head mix, post's mix gradients, one Function
#   alone): a few fp32 roundings a step over at most 19 Sinkhorn steps: 1e-5.
BF16_BOUND = 2.0 ** -6
TF32_BOUND = 2.0 ** -8
LAYER_BOUND = 2.0 ** -5
FP32_BOUND = 1e-5


def assert_normwise(actual: torch.Tensor, wanted: torch.Tensor, bound: float, name: str) -> None:
    assert actual.shape == wanted.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(wanted.shape)}"
    scale = wanted.abs().max().item() if wanted.numel() else 0.0
    error = (actual.double() - wanted).abs().max().item() if wanted.numel() else 0.0
    assert error <= bound * scale, f"{name}: max error {error:.3e} > {bound:.1e} · {scale:.3e}"


def assert_grads(grads: dict, wanted: dict, bounds: dict) -> None:
    for name, bound in bounds.items():
        assert_normwise(grads[name], wanted[name], bound, f"{name}.grad")


def layer_inputs(lead: tuple, seed: int, *, norm_weight: bool = True, fn_rows: int = N3) -> dict:
    """fn scaled so that the mixes are O(1) (the sigmoids and Sinkhorn see real work)."""
    inputs = {
        "residual": randn((*lead, N, HIDDEN), seed, torch.bfloat16),
        "fn": randn((fn_rows, K), seed + 1) * K ** -0.5,
        "scale": randn((3,), seed + 2) * 0.5,
        "base": randn((N3,), seed + 3) * 0.1,
    }
    if norm_weight:
        inputs["norm_weight"] = randn((K,), seed + 4) * 0.1 + 1
    return inputs


def leaves(inputs: dict) -> dict:
    return {name: t.detach().clone().requires_grad_() for name, t in inputs.items()}


def pre_post(inputs: dict, d_out: torch.Tensor, *, target, flavor=None, retain_graph=False):
    """One sublayer in training with an identity sublayer; the outputs and the leaves' gradients."""
    p = leaves(inputs)
    layer_input, (post_mix, comb_mix) = mhc_pre(p["residual"], p["fn"], p["scale"], p["base"],
                                                norm_weight=p.get("norm_weight"), n_splits=SPLITS, target=target,
                                                flavor=flavor, **OPTIONS)
    out = mhc_post(layer_input, p["residual"], post_mix, comb_mix, target=target, flavor=flavor)
    out.backward(d_out, retain_graph=retain_graph)
    grads = {name: t.grad for name, t in p.items()}
    return (layer_input, post_mix, comb_mix, out), grads, (out, p)


def pre_post_exact(inputs: dict, d_out: torch.Tensor):
    p = {name: t.detach().double().requires_grad_() for name, t in inputs.items()}
    layer_input, (post_mix, comb_mix) = exact.mhc_pre(p["residual"], p["fn"], p["scale"], p["base"],
                                                      norm_weight=p.get("norm_weight"), **OPTIONS)
    out = exact.mhc_post(layer_input, p["residual"], post_mix, comb_mix)
    out.backward(d_out.double())
    return (layer_input, post_mix, comb_mix, out), {name: t.grad for name, t in p.items()}


def pre_post_by_hand(inputs: dict, d_out: torch.Tensor, *, target, flavor=None) -> dict:
    """Spec §1.2 and §1.3 with the kernel-level entry points: the gradients (and the forward outputs)
    the autograd layer must equal."""
    kw = {"target": target, "flavor": flavor}
    residual, fn, scale, base = inputs["residual"], inputs["fn"], inputs["scale"], inputs["base"]
    norm_weight = inputs.get("norm_weight")
    tokens = residual.numel() // K
    streams = residual.reshape(tokens, N, HIDDEN)
    x = streams.view(tokens, K)
    fn_eff = fn if norm_weight is None else mhc_fn_normw_merge_fwd(fn, norm_weight, None, **kw)
    partials, sq_partials = mhc_pre_norm_fn_gemm_fwd(x, fn_eff, n_splits=SPLITS, **kw)
    out_mul, sqrsum, mixes = mhc_reduce_partials_and_rmsnorm_fwd(
        partials.view(SPLITS, tokens, 1, N3), sq_partials.view(SPLITS, tokens, 1), None, None, None, K,
        OPTIONS["norm_eps"], SPLITS, **kw)
    pre, post, logits = mhc_pre_split_mixes_fwd(mixes, scale, base, None, None, None, OPTIONS["post_mult_value"],
                                                OPTIONS["pre_eps"], **kw)
    comb = mhc_sinkhorn_fwd(logits.view(tokens, N, N), None, OPTIONS["sinkhorn_repeat"], OPTIONS["sinkhorn_eps"], **kw)
    layer_input = mhc_pre_apply_mix_fwd(streams, pre, torch.empty(tokens, HIDDEN, dtype=torch.bfloat16), **kw)
    four_d = (1, tokens)
    out = mhc_post_fwd(layer_input.view(*four_d, HIDDEN), streams.view(*four_d, N, HIDDEN), post.view(*four_d, N, 1),
                       comb.view(*four_d, N, N), **kw)
    d_x, buffer, d_post, d_comb = mhc_post_bwd(layer_input.view(*four_d, HIDDEN), streams.view(*four_d, N, HIDDEN),
                                               post.view(*four_d, N, 1), comb.view(*four_d, N, N),
                                               d_out.reshape(*four_d, N, HIDDEN), **kw)
    buffer = buffer.view(tokens, N, HIDDEN)
    pre_grad = mhc_pre_apply_mix_bwd(d_x.view(tokens, HIDDEN), streams, pre, buffer, **kw)
    logits_grad = mhc_sinkhorn_bwd(d_comb.view(tokens, N, N), logits.view(tokens, N, N), None,
                                   OPTIONS["sinkhorn_repeat"], OPTIONS["sinkhorn_eps"], **kw)
    mixes_grad, scale_grad, base_grad = mhc_pre_split_mixes_bwd(
        pre_grad, d_post.view(tokens, N), logits_grad.view(tokens, N * N), mixes, post, scale, base, None, None,
        None, OPTIONS["post_mult_value"], **kw)
    out_mul_grad, sqrsum_grad = mhc_reduce_partials_and_rmsnorm_bwd(mixes_grad, out_mul, sqrsum, None, None, K,
                                                                    OPTIONS["norm_eps"], **kw)
    _, fn_eff_grad = mhc_pre_norm_fn_gemm_bwd(out_mul_grad.view(tokens, N3), sqrsum_grad.view(tokens), x, fn_eff,
                                              buffer.view(tokens, K), **kw)
    grads = {"residual": buffer.view(residual.shape), "scale": scale_grad, "base": base_grad, "fn": fn_eff_grad}
    if norm_weight is not None:
        fn_grad, normw_grad = torch.zeros_like(fn), torch.zeros_like(norm_weight)
        mhc_fn_normw_merge_bwd(fn, norm_weight, fn_eff_grad, fn_grad, normw_grad, **kw)
        grads.update(fn=fn_grad, norm_weight=normw_grad)
    outputs = (layer_input, post, comb, out)
    return grads, outputs


def check_pre_post(lead: tuple, seed: int, *, target, flavor=None, norm_weight=True):
    inputs = layer_inputs(lead, seed, norm_weight=norm_weight)
    d_out = randn((*lead, N, HIDDEN), seed + 9, torch.bfloat16)
    outputs, grads, _ = pre_post(inputs, d_out, target=target, flavor=flavor)
    by_hand, by_hand_outputs = pre_post_by_hand(inputs, d_out, target=target, flavor=flavor)
    for name, wanted in by_hand.items():
        assert_bitwise_equal(grads[name], wanted, f"{name}.grad vs spec §1.3 by hand [{target} {flavor}]")
    for actual, wanted in zip(outputs, by_hand_outputs, strict=True):
        assert_bitwise_equal(actual.detach().reshape(wanted.shape), wanted, "forward output vs by hand")
    exact_outputs, wanted = pre_post_exact(inputs, d_out)
    for name, actual, want, bound in zip(("layer_input", "post_mix", "comb_mix", "out"), outputs, exact_outputs,
                                         (BF16_BOUND, TF32_BOUND, TF32_BOUND, BF16_BOUND), strict=True):
        assert_normwise(actual.detach(), want.detach(), bound, name)
    assert_grads(grads, wanted, {name: BF16_BOUND if name == "residual" else LAYER_BOUND for name in wanted})


def test_pre_post_torch():
    check_pre_post(FEW, 0, target="torch")


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("norm_weight", (True, False))
def test_pre_post_cpu(flavor, norm_weight):
    check_pre_post(LEAD, 1, target="cpu", flavor=flavor, norm_weight=norm_weight)


@pytest.mark.slow
def test_pre_post_ascend_sim():
    check_pre_post((1, 70), 3, target="ascend-sim")


@pytest.mark.slow
def test_pre_post_cpu_many_tokens():
    check_pre_post((4096,), 2, target="cpu")


@pytest.mark.parametrize("target", ("torch", pytest.param("cpu", marks=pytest.mark.slow)))
def test_repeated_backward_is_identical(target):
    lead = FEW if target == "torch" else LEAD
    inputs = layer_inputs(lead, 3)
    d_out = randn((*lead, N, HIDDEN), 4, torch.bfloat16)
    _, first, (out, p) = pre_post(inputs, d_out, target=target, retain_graph=True)
    first = {name: g.clone() for name, g in first.items()}
    for t in p.values():
        t.grad = None
    out.backward(d_out)
    for name, t in p.items():
        assert_bitwise_equal(t.grad, first[name], f"{name}.grad, second backward")


def test_partial_backward_first_leaves_nothing_stale():
    """A backward of the layer input alone (pre_apply_mix and norm_fn, no post) and then the full one:
    the second pass must not reuse the first pass's buffer."""
    inputs = layer_inputs(FEW, 5)
    d_out = randn((*FEW, N, HIDDEN), 6, torch.bfloat16)
    _, fresh, _ = pre_post(inputs, d_out, target="torch")
    p = leaves(inputs)
    layer_input, (post_mix, comb_mix) = mhc_pre(p["residual"], p["fn"], p["scale"], p["base"],
                                                norm_weight=p["norm_weight"], n_splits=SPLITS, target="torch",
                                                **OPTIONS)
    out = mhc_post(layer_input, p["residual"], post_mix, comb_mix, target="torch")
    torch.autograd.grad(layer_input.float().sum(), p["residual"], retain_graph=True)
    out.backward(d_out)
    for name, t in p.items():
        assert_bitwise_equal(t.grad, fresh[name], f"{name}.grad after a partial backward")


def test_residual_also_consumed_elsewhere():
    """Another op's gradient of the residual reaches autograd's sum with the complete buffer, before
    or after the mHC nodes run; detached mixes make post return its own gradient."""
    inputs = layer_inputs(FEW, 7)
    d_out = randn((*FEW, N, HIDDEN), 8, torch.bfloat16)
    weight = randn((*FEW, N, HIDDEN), 9)
    exact_inputs = {name: t.detach().double().requires_grad_() for name, t in inputs.items()}
    layer_input, (post_mix, comb_mix) = exact.mhc_pre(
        exact_inputs["residual"], exact_inputs["fn"], exact_inputs["scale"], exact_inputs["base"],
        norm_weight=exact_inputs["norm_weight"], **OPTIONS)
    for detach in (False, True):
        p = leaves(inputs)
        early = (p["residual"].float() * weight).sum()  # its backward node is older: it runs last
        li, (pm, cm) = mhc_pre(p["residual"], p["fn"], p["scale"], p["base"], norm_weight=p["norm_weight"],
                               n_splits=SPLITS, target="torch", **OPTIONS)
        if detach:
            pm, cm = pm.detach(), cm.detach()
        out = mhc_post(li, p["residual"], pm, cm, target="torch")
        late = (p["residual"].float() * weight).sum()  # created last: its backward runs first
        ((out.float() * d_out.float()).sum() + early + late).backward()
        x = exact_inputs["residual"]
        ref_out = exact.mhc_post(layer_input, x, post_mix.detach() if detach else post_mix,
                                 comb_mix.detach() if detach else comb_mix)
        wanted, = torch.autograd.grad((ref_out * d_out.double()).sum() + 2 * (x * weight.double()).sum(), x,
                                      retain_graph=True)
        assert_normwise(p["residual"].grad, wanted, BF16_BOUND, f"residual.grad (detached mixes: {detach})")


class BigFuseSpy:
    def __init__(self, monkeypatch):
        self.calls = 0
        real = functional.mhc_pre_big_fuse_fwd

        def spy(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(functional, "mhc_pre_big_fuse_fwd", spy)


def run_pre(inputs: dict, target, flavor=None):
    return mhc_pre(inputs["residual"], inputs["fn"], inputs["scale"], inputs["base"],
                   norm_weight=inputs.get("norm_weight"), n_splits=SPLITS, target=target, flavor=flavor, **OPTIONS)


def check_inference_paths(monkeypatch, target, flavor=None):
    inputs = layer_inputs(FEW if target == "torch" else LEAD, 10)
    spy = BigFuseSpy(monkeypatch)
    train_input, (train_post, train_comb) = run_pre(leaves(inputs), target, flavor)
    assert spy.calls == 0 and train_input.requires_grad
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            layer_input, (post_mix, comb_mix) = run_pre(leaves(inputs), target, flavor)
        assert not layer_input.requires_grad
        # The fused kernel is bit-identical to the chain's forward (spec §5.1); §4 asks for 1e-4.
        for actual, wanted in ((layer_input, train_input), (post_mix, train_post), (comb_mix, train_comb)):
            torch.testing.assert_close(actual.float(), wanted.detach().float(), atol=1e-4, rtol=1e-4)
            assert_bitwise_equal(actual, wanted.detach(), "no-grad path vs training path")
    assert spy.calls == 2
    run_pre(inputs, target, flavor)  # grad mode on, but nothing requires grad: nothing to record
    assert spy.calls == 3


def test_no_grad_takes_big_fuse(monkeypatch):
    check_inference_paths(monkeypatch, "torch")


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
def test_no_grad_takes_big_fuse_cpu(monkeypatch, flavor):
    check_inference_paths(monkeypatch, "cpu", flavor)


def check_head(lead: tuple, seed: int, *, target, flavor=None):
    inputs = layer_inputs(lead, seed, fn_rows=N)
    inputs["scale"], inputs["base"] = inputs["scale"][:1].clone(), inputs["base"][:N].clone()
    p = leaves(inputs)
    d_out = randn((*lead, HIDDEN), seed + 9, torch.bfloat16)
    out = mhc_head(p["residual"], p["fn"], p["scale"], p["base"], norm_weight=p["norm_weight"], pre_eps=1e-2,
                   n_splits=SPLITS, target=target, flavor=flavor)
    out.backward(d_out)
    q = {name: t.detach().double().requires_grad_() for name, t in inputs.items()}
    wanted = exact.mhc_head(q["residual"], q["fn"], q["scale"], q["base"], norm_weight=q["norm_weight"], pre_eps=1e-2)
    (wanted * d_out.double()).sum().backward()
    assert_normwise(out.detach(), wanted.detach(), BF16_BOUND, "head output")
    assert_grads({name: t.grad for name, t in p.items()}, {name: t.grad for name, t in q.items()},
                 {name: BF16_BOUND if name == "residual" else LAYER_BOUND for name in p})


def test_head_without_post():
    check_head(FEW, 11, target="torch")


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
def test_head_without_post_cpu(flavor):
    check_head(LEAD, 12, target="cpu", flavor=flavor)


@pytest.mark.parametrize("target", ("torch", pytest.param("cpu", marks=pytest.mark.slow)))
def test_zero_tokens(target):
    inputs = layer_inputs((0,), 13)
    (layer_input, post_mix, comb_mix, out), grads, _ = pre_post(inputs, torch.zeros(0, N, HIDDEN,
                                                                                    dtype=torch.bfloat16),
                                                                 target=target)
    assert layer_input.shape == (0, HIDDEN) and post_mix.shape == (0, N, 1) and comb_mix.shape == (0, N, N)
    assert out.shape == (0, N, HIDDEN) and grads["residual"].shape == (0, N, HIDDEN)
    for name in ("fn", "scale", "base", "norm_weight"):
        assert grads[name].shape == inputs[name].shape and not grads[name].any(), name


# --- each Function against the float64 formula ---

def function_grads(fn, exact_fn, inputs: dict, seed: int):
    """The Function's outputs and input gradients for random output gradients, and the exact ones."""
    p = leaves(inputs)
    outputs = fn(**p)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    out_grads = [randn(tuple(o.shape), seed + i, o.dtype) for i, o in enumerate(outputs)]
    torch.autograd.backward(outputs, out_grads)
    q = {name: t.detach().double().requires_grad_() for name, t in inputs.items()}
    wanted = exact_fn(**q)
    wanted = wanted if isinstance(wanted, tuple) else (wanted,)
    torch.autograd.backward(wanted, [g.double() for g in out_grads])
    return outputs, wanted, {name: t.grad for name, t in p.items()}, {name: t.grad for name, t in q.items()}


def check_function(fn, exact_fn, inputs, seed, output_bound, grad_bounds):
    outputs, wanted, grads, exact_grads = function_grads(fn, exact_fn, inputs, seed)
    for i, (actual, want) in enumerate(zip(outputs, wanted, strict=True)):
        assert_normwise(actual.detach(), want.detach(), output_bound, f"output {i}")
    assert_grads(grads, exact_grads, grad_bounds)


def check_sinkhorn_and_split(target, flavor):
    mixes = randn((*LEAD, N3), 20)
    check_function(lambda input_mixes, mhc_scale, mhc_base: mhc_pre_split_mixes(
        input_mixes, mhc_scale, mhc_base, N, 2.0, 1e-2, target=target, flavor=flavor),
        lambda input_mixes, mhc_scale, mhc_base: exact.mhc_pre_split_mixes(input_mixes, mhc_scale, mhc_base, N, 2.0,
                                                                          1e-2),
        {"input_mixes": mixes, "mhc_scale": randn((3,), 21), "mhc_base": randn((N3,), 22) * 0.1}, 23, FP32_BOUND,
        {"input_mixes": FP32_BOUND, "mhc_scale": FP32_BOUND, "mhc_base": FP32_BOUND})
    check_function(lambda x: sinkhorn_normalize(x, 10, 1e-6, target=target, flavor=flavor),
                   lambda x: exact.sinkhorn_normalize(x, 10, 1e-6), {"x": randn((*LEAD, N, N), 24)}, 25, FP32_BOUND,
                   {"x": FP32_BOUND})


def check_apply(target, flavor):
    check_function(lambda x, mix: mhc_pre_apply_mix(x, mix, target=target, flavor=flavor), exact.mhc_pre_apply_mix,
                   {"x": randn((*LEAD, N, HIDDEN), 30, torch.bfloat16), "mix": torch.sigmoid(randn((*LEAD, N, 1), 31))},
                   32, BF16_BOUND, {"x": BF16_BOUND, "mix": FP32_BOUND})


def check_post(target, flavor):
    check_function(lambda x, residual, post_layer_mix, comb_res_mix: mhc_post(
        x, residual, post_layer_mix, comb_res_mix, target=target, flavor=flavor), exact.mhc_post,
        {"x": randn((*LEAD, HIDDEN), 33, torch.bfloat16), "residual": randn((*LEAD, N, HIDDEN), 30, torch.bfloat16),
         "post_layer_mix": randn((*LEAD, N, 1), 34), "comb_res_mix": randn((*LEAD, N, N), 35)}, 36, BF16_BOUND,
        {"x": BF16_BOUND, "residual": BF16_BOUND, "post_layer_mix": FP32_BOUND, "comb_res_mix": FP32_BOUND})


def check_norm_fn_head_expand(target, flavor):
    inputs = layer_inputs(LEAD, 40)
    check_function(lambda residual, fn, norm_weight: mhc_pre_norm_fn(residual, fn, norm_weight, 1e-6, False, SPLITS,
                                                                      target=target, flavor=flavor),
                   lambda residual, fn, norm_weight: exact.mhc_pre_norm_fn(residual, fn, norm_weight, 1e-6),
                   {name: inputs[name] for name in ("residual", "fn", "norm_weight")}, 41, TF32_BOUND,
                   {"residual": BF16_BOUND, "fn": TF32_BOUND, "norm_weight": TF32_BOUND})
    check_function(lambda input_mix, mhc_scale, mhc_base: mhc_head_compute_mix(input_mix, mhc_scale, mhc_base, 1e-2,
                                                                               target=target, flavor=flavor),
                   lambda input_mix, mhc_scale, mhc_base: exact.mhc_head_compute_mix(input_mix, mhc_scale, mhc_base,
                                                                                     1e-2),
                   {"input_mix": randn((*LEAD, N), 42), "mhc_scale": randn((1,), 43), "mhc_base": randn((N,), 44)},
                   45, FP32_BOUND, {"input_mix": FP32_BOUND, "mhc_scale": FP32_BOUND, "mhc_base": FP32_BOUND})
    check_function(lambda hidden: expand_to_mhc(hidden, N, target=target, flavor=flavor),
                   lambda hidden: exact.expand_to_mhc(hidden, N), {"hidden": randn((*LEAD, HIDDEN), 46,
                                                                                   torch.bfloat16)},
                   47, 0.0, {"hidden": BF16_BOUND})


def test_functions_torch():
    for check in (check_sinkhorn_and_split, check_apply, check_post, check_norm_fn_head_expand):
        check("torch", None)


def test_apply_cpu():
    check_apply("cpu", "ascend")


def test_post_cpu():
    check_post("cpu", "ascend")


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
def test_functions_cpu(flavor):
    for check in (check_sinkhorn_and_split, check_apply, check_post, check_norm_fn_head_expand):
        check("cpu", flavor)


@pytest.mark.slow
def test_functions_ascend_sim():
    check_sinkhorn_and_split("ascend-sim", None)


def test_head_compute_mix_by_hand():
    """The head mix's gain and bias gradients: its kernel's partial rows added in row order."""
    input_mix, scale, base = randn((150, N), 50), randn((1,), 51), randn((N,), 52)
    d_out = randn((150, N), 53)
    p = leaves({"input_mix": input_mix, "scale": scale, "base": base})
    mhc_head_compute_mix(p["input_mix"], p["scale"], p["base"], 1e-2, target="torch").backward(d_out)
    output = mhc_head_compute_mix_fwd(input_mix, scale, base, None, 1e-2, target="torch")
    assert output.shape == (150, N)
    input_grad, scale_rows, base_rows = mhc_head_compute_mix_bwd(d_out, input_mix, scale, base, None, None, None, 3,
                                                                 target="torch")
    assert_bitwise_equal(p["input_mix"].grad, input_grad, "input_mix.grad")
    assert_bitwise_equal(p["scale"].grad, ((torch.zeros(1) + scale_rows[0]) + scale_rows[1]) + scale_rows[2],
                         "scale.grad")
    assert_bitwise_equal(p["base"].grad, ((torch.zeros(N) + base_rows[0]) + base_rows[1]) + base_rows[2],
                         "base.grad")


def test_norm_fn_alone_fused_or_not():
    """A fused norm_fn with no post or pre_apply_mix starts from zeros (spec §6.3): the same bits as
    ``fuse_grad_acc=False``."""
    inputs = layer_inputs(FEW, 60)
    d_mixes = randn((*FEW, N3), 61)
    grads = []
    for fuse in (True, False):
        p = leaves({name: inputs[name] for name in ("residual", "fn", "norm_weight")})
        mhc_pre_norm_fn(p["residual"], p["fn"], p["norm_weight"], 1e-6, fuse, SPLITS, target="torch").backward(d_mixes)
        grads.append(p)
    for name, t in grads[0].items():
        assert_bitwise_equal(t.grad, grads[1][name].grad, f"{name}.grad, fused vs not")


# --- no second derivatives ---

def _second_order_cases():
    """Each Function on the ``torch`` target (its plumbing is the kernels'): name, call, inputs.
    (``expand_to_mhc`` is linear: its gradient depends on nothing differentiable, as torch's
    ``expand``'s.)"""
    norm = layer_inputs(FEW, 60)
    return [
        ("PreNormFn", lambda residual, fn: mhc_pre_norm_fn(residual, fn, None, 1e-6, False, SPLITS, target="torch"),
         {"residual": norm["residual"], "fn": norm["fn"]}),
        ("FnNormwMerge", lambda fn, norm_weight: mhc_pre_norm_fn(norm["residual"], fn, norm_weight, 1e-6, False,
                                                                  SPLITS, target="torch"),
         {"fn": norm["fn"], "norm_weight": norm["norm_weight"]}),
        ("PreSplitMixes", lambda input_mixes: mhc_pre_split_mixes(input_mixes, norm["scale"], norm["base"], N, 2.0,
                                                                  1e-2, target="torch"),
         {"input_mixes": randn((*FEW, N3), 62)}),
        ("SinkhornNormalize", lambda x: sinkhorn_normalize(x, 10, 1e-6, target="torch"),
         {"x": randn((*FEW, N, N), 63)}),
        ("PreApplyMix", lambda x, mix: mhc_pre_apply_mix(x, mix, target="torch"),
         {"x": randn((*FEW, N, HIDDEN), 64, torch.bfloat16), "mix": torch.sigmoid(randn((*FEW, N, 1), 65))}),
        ("Post", lambda x, post_layer_mix: mhc_post(x, randn((*FEW, N, HIDDEN), 66, torch.bfloat16), post_layer_mix,
                                                    randn((*FEW, N, N), 67), target="torch"),
         {"x": randn((*FEW, HIDDEN), 68, torch.bfloat16), "post_layer_mix": randn((*FEW, N, 1), 69)}),
        ("HeadComputeMix", lambda input_mix: mhc_head_compute_mix(input_mix, norm["scale"][:1], norm["base"][:N],
                                                                  1e-2, target="torch"),
         {"input_mix": randn((*FEW, N), 70)}),
    ]


@pytest.mark.parametrize("case", range(7))
def test_second_derivative_raises_naming_the_function(case):
    """``grad(out.sum(), create_graph=True)`` gets a constant incoming gradient, which
    ``once_differentiable`` let through as a silent zero: the gradients are the first-order ones,
    and differentiating them raises."""
    name, call, inputs = _second_order_cases()[case]
    p = leaves(inputs)
    outputs = call(**p)
    loss = sum(o.float().sum() for o in (outputs if isinstance(outputs, tuple) else (outputs,)))
    grads = torch.autograd.grad(loss, list(p.values()), create_graph=True)
    q = leaves(inputs)
    outputs = call(**q)
    plain = torch.autograd.grad(sum(o.float().sum() for o in (outputs if isinstance(outputs, tuple) else (outputs,))),
                                list(q.values()))
    for g, want, arg in zip(grads, plain, p, strict=True):
        assert g.requires_grad
        assert_bitwise_equal(g.detach(), want, f"{arg}.grad")
    with pytest.raises(RuntimeError, match=f"{name} has no second derivative"):
        torch.autograd.grad(grads[0].float().sum(), list(p.values()), allow_unused=True)


@pytest.mark.parametrize("case", range(7))
def test_input_changed_in_place_before_backward_is_torchs_error(case):
    """The Functions save their inputs themselves (not views made in forward), so torch's version
    counter names the changed tensor."""
    _, call, inputs = _second_order_cases()[case]
    p = leaves(inputs)
    outputs = call(**p)
    loss = sum(o.float().sum() for o in (outputs if isinstance(outputs, tuple) else (outputs,)))
    with torch.no_grad():
        next(iter(p.values())).add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("case", [0, 4, 5])
def test_v1_storage_buffer_is_refused_not_left_zero(case):
    """v1 code puts a zero buffer on the residual's storage before backward and reads it after:
    vmi never fills it, so the backward of mhc_pre_norm_fn, mhc_pre_apply_mix and mhc_post raises."""
    _, call, inputs = _second_order_cases()[case]
    p = leaves(inputs)
    outputs = call(**p)
    residual = p["residual"] if "residual" in p else p["x"]
    if case == 5:  # mhc_post's residual is not a leaf of the case: give it one
        residual = randn((*FEW, N, HIDDEN), 66, torch.bfloat16).requires_grad_()
        outputs = mhc_post(p["x"], residual, p["post_layer_mix"], randn((*FEW, N, N), 67), target="torch")
    residual.untyped_storage().grad_from_mhc_post = torch.zeros_like(residual)
    loss = sum(o.float().sum() for o in (outputs if isinstance(outputs, tuple) else (outputs,)))
    with pytest.raises(RuntimeError, match="grad_from_mhc_post"):
        loss.backward()
