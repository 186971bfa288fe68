"""Every op is a torch custom op (``torch.ops.vmi.*``): ``opcheck`` on a sample set per op, fake and
meta tensors give the outputs a real call gives (shapes, dtypes, strides), and ``torch.compile``
with ``fullgraph=True`` over ops of every family gives eager's bits.

The samples are the public API's own calls, recorded at the dispatcher: each op of the ``vmi``
command at a small shape with its default options, plus the variants the command does not reach
(preallocated outputs, in-place and optional mutable arguments, the SF-only and precomputed-SF
forms). Every declared op must have a sample. Shapes and option values follow cases of the op
tests where that makes a sample run a kernel specialisation those tests compile anyway.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

import vmi_mhc
import vmi_moe
import vmi_quant
from vmi_core.library import KERNEL_OPS, NAMESPACE
from vmi_core.tools.registry import discover
from vmi_core.tools.testing import randn

OPS = {op.name: op for op in discover().values()}


class _Recorder(TorchDispatchMode):
    """Records each ``vmi`` op call with its arguments as they were before the call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == NAMESPACE:
            clone = lambda v: v.clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
            self.calls.append((func, tree_map(clone, args), tree_map(clone, kwargs)))
        return func(*args, **kwargs)


# Per-op (shape, option overrides, flavor) of the registry samples, chosen so that each sample runs a
# kernel specialisation the op's own tests already compile (every cpu kernel specialisation costs
# seconds of compilation; one the op tests build comes from the disk cache): the hidden sizes the
# mHC tests use (the RMS group size 4·1280 of test_norm_fn / test_pre_big_fuse, test_pre_norm_fn_gemm's
# 4·128 with 2 splits, test_autograd's 64, test_multilayer_recompute's 1000 with 3 layers), 72 experts
# as the MoE tests route, and the options (cuda flavor included) of a case of the quant tests. Other
# ops: (12, 256) at the defaults (128 rows for the block-wise casts).
_REGISTRY_SAMPLE = {
    "mhc_pre_big_fuse_fwd": ((12, 1280), {}, None),
    "mhc_reduce_partials_and_rmsnorm_fwd": ((12, 1280), {}, None),
    "mhc_reduce_partials_and_rmsnorm_bwd": ((12, 1280), {}, None),
    "mhc_pre_norm_fn_gemm_fwd": ((12, 128), {"n_splits": 2}, None),
    "mhc_pre_norm_fn_gemm_bwd": ((12, 128), {}, None),
    "mhc_post_fwd": ((12, 64), {}, None),
    "mhc_post_bwd": ((12, 64), {}, None),
    "mhc_pre_apply_mix_bwd": ((12, 64), {}, None),
    "mhc_multilayer_recompute": ((12, 1000), {"num_layers": 3, "last_post": False}, None),
    "moe_topk_gate": ((12, 72), {}, None),
    "moe_topk_gate_backward": ((12, 72), {}, None),
    "topk_gate": ((12, 72), {}, None),
    "group_count": ((12, 72), {"num_topk": 6}, None),
    "aux_fi": ((12, 72), {"num_topk": 6}, None),
    "norm_forward": ((12, 7168), {"use_weight": False}, "cuda"),
    "norm_forward_and_per_token_cast": (
        (12, 96), {"use_residual": True, "round_sf": True, "use_packed_ue8m0": True, "with_out_bf16": True}, None),
    "norm_backward": ((12, 96), {"with_residual_grad": True, "scaled": True}, None),
    "per_block_cast": ((128, 256), {"block_m": 32, "block_k": 32}, None),
    "swiglu_forward": ((12, 256), {"in_dtype": "fp32", "fmt": "fp32"}, None),
    "swiglu_forward_and_per_token_cast": (
        (12, 256), {"in_dtype": "fp32", "num_per_channels": 128, "experts": 0, "weights": False, "clamp": False},
        "cuda"),
    "swiglu_backward": ((12, 128), {"fmt": "fp32", "clamp": True}, None),
    "swiglu_backward_and_per_token_cast": (
        (12, 512), {"clamp": True, "do_recompute": True, "round_sf": True, "use_packed_ue8m0": True,
                    "use_tma_aligned_col_major_sf": True}, None),
}


def _registry_call(name: str):
    op = OPS[name]
    default_shape = ((128, 256) if name.startswith(("per_block", "per_channel", "batched_transpose",
                                                    "swiglu_forward_and_per_channel")) else (12, 256))
    shape, overrides, flavor = _REGISTRY_SAMPLE.get(name, (default_shape, {}, None))
    options = {o.name: o.default for o in op.options} | overrides
    inputs = op.make_inputs(shape, options, 0)
    return lambda: op.run(inputs, options, "cpu", flavor)


X = randn((12, 256), 1, torch.bfloat16)
XB = randn((128, 256), 2, torch.bfloat16)
# 72 experts, top 6: the MoE tests' gate (their kernels are the ones the gate samples run).
LOGITS, K = randn((12, 72), 3), 6
MIXES = randn((12, 24), 16)
MIX_SCALE, MIX_BASE = randn((3,), 10), randn((24,), 11)
COMB = randn((12, 4, 4), 4)


def _transpose_into_reused_outputs():
    # A 2-D weight's scales and a grouped one's.
    sf = [vmi_quant.reference.cast(XB, "e4m3", (32, 32), round_sf=True)[1],
          torch.exp2(torch.arange(-8.0, 8.0)).view(1, 4, 4)]
    first = vmi_quant.batched_transpose_weight_sf(sf, 32, [False, True])
    vmi_quant.batched_transpose_weight_sf(sf, 32, [False, True], [None, first[1]])


def _norm_cast_with_mega_moe_sf():
    # test_norm_forward's Mega MoE case: hidden 512, column-major power-of-two SF, block 192, cuda flavor.
    mega = torch.full((4 * 256,), -1, dtype=torch.int32).as_strided((12, 4), (1, 256))
    vmi_quant.norm_forward_and_per_token_cast(randn((12, 512), 17, torch.bfloat16), None, 1e-6, "e4m3", 32,
                                              use_tma_aligned_col_major_sf=True, round_sf=True, mega_moe_sf=mega,
                                              mega_moe_block_m=192, flavor="cuda")


def _gate_with_mutable_arguments():
    scores = torch.empty_like(LOGITS)
    unmapped = torch.full((12, K), -1, dtype=torch.int64)
    vmi_moe.moe_topk_gate_forward(LOGITS, K, False, 0, 1.5, 0, unmapped_topk_idx=unmapped, scores=scores,
                                  out=(torch.empty(12, K, dtype=torch.int64), torch.empty(12, K)))


def _backward_with_out():
    scores = torch.nn.functional.softplus(LOGITS).sqrt()
    idx, weights = vmi_moe.topk_gate(scores, K), torch.rand(12, K)
    vmi_moe.moe_topk_gate_backward(scores, idx, weights, torch.rand(12, K), 1.5, out=torch.empty_like(scores))


def _gate_with_autograd():
    # A shared expert, padded tokens, a bias, fixed routing and force-random tokens (test_moe_autograd's).
    logits = LOGITS.clone().requires_grad_()
    vmi_moe.moe_topk_gate_autograd(logits, K, True, 1, 1.5, 0, mask=torch.arange(12) % 5 != 0,
                                   bias=randn((72,), 18) * 0.5, fix_routing_mask=torch.arange(12) % 4 == 1,
                                   unmapped_topk_idx=torch.arange(12 * K).view(12, K) % 72,
                                   force_random=torch.arange(12) % 6 == 5, num_sequences=3)


def _split_mixes_into_outputs():
    # The kernel-level API: every output given (the .out overloads), the backward fed the forward's post mix.
    mixes, scale, base = randn((12, 24), 4), randn((3,), 5), randn((24,), 6)
    _, post, _ = vmi_mhc.mhc_pre_split_mixes_fwd(mixes, scale, base, torch.empty(12, 4), torch.empty(12, 4),
                                                 torch.empty(12, 16), 2.0, 1e-2)
    vmi_mhc.mhc_pre_split_mixes_bwd(randn((12, 4), 7), randn((12, 4), 8), randn((12, 16), 9), mixes, post, scale,
                                    base, torch.empty(12, 24), torch.empty(3), torch.empty(24), 0.0)


def _head_mix_into_outputs():
    # The kernel-level API: every output given (the .out overloads), with TileKernels' block-size hint.
    x, scale, base = randn((12, 4), 12), randn((1,), 13), randn((4,), 14)
    vmi_mhc.mhc_head_compute_mix_fwd(x, scale, base, torch.empty(12, 4), 1e-2, 32)
    vmi_mhc.mhc_head_compute_mix_bwd(randn((12, 4), 15), x, scale, base, torch.empty(12, 4), torch.empty(3, 1),
                                     torch.empty(3, 4), 3, 32)


def _norm_fn_stages_into_given_outputs():
    # The kernel-level API writes preallocated outputs (the ``.out`` overloads); 3 splits, 24 mixes,
    # test_norm_fn's RMS group size 4·1280.
    fn, normw = randn((24, 256), 4), randn((256,), 5)
    vmi_mhc.mhc_fn_normw_merge_fwd(fn, normw, torch.empty(24, 256))
    partials, sqrsums = randn((3, 12, 1, 24), 6), torch.rand(3, 12, 1) + 0.5
    out_mul, sqrsum, _ = vmi_mhc.mhc_reduce_partials_and_rmsnorm_fwd(
        partials, sqrsums, torch.empty(12, 1, 24), torch.empty(12, 1), torch.empty(12, 24), 5120, 1e-6, 3)
    vmi_mhc.mhc_reduce_partials_and_rmsnorm_bwd(MIXES, out_mul, sqrsum, torch.empty(12, 1, 24), torch.empty(12, 1),
                                                5120, 1e-6)


def _prenorm_gemm_into_given_outputs():
    # The registry sample's shape (K = 4·128) and splits (2, as test_pre_norm_fn_gemm): the forward
    # into preallocated partials, the backward into a given fn_grad.
    x, fn = randn((12, 512), 4, torch.bfloat16), randn((24, 512), 5) * 1e-2
    vmi_mhc.mhc_pre_norm_fn_gemm_fwd(x, fn, torch.empty(2, 12, 24), torch.empty(2, 12), 2)
    vmi_mhc.mhc_pre_norm_fn_gemm_bwd(randn((12, 24), 6), randn((12,), 7), x, fn, randn((12, 512), 8, torch.bfloat16),
                                     torch.empty(24, 512))


VARIANTS = {
    "per_token_cast-out": lambda: vmi_quant.per_token_cast(
        X, "e4m3", 32, out=(torch.empty(12, 256, dtype=torch.float8_e4m3fn), torch.empty(12, 8))),
    "per_token_cast-quantized-x": lambda: vmi_quant.per_token_cast(
        vmi_quant.per_token_cast(X, "e4m3", 32), "e2m1", 64, x_block_size=(1, 32), round_sf=True),
    "per_token_cast_with_sf_only": lambda: vmi_quant.per_token_cast_with_sf_only(
        X.float(), "e2m1", 128, round_sf=True, use_packed_ue8m0=True),
    "per_token_cast_with_precomputed_sf": lambda: vmi_quant.per_token_cast_with_precomputed_sf(
        X, "e4m3", 32, torch.rand(12, 8) + 0.5),
    "per_block_cast-out": lambda: vmi_quant.per_block_cast(
        XB, "e2m1", (32, 128), round_sf=True, out=(torch.empty(128, 128, dtype=torch.int8), torch.empty(4, 2))),
    "per_block_cast_with_sf_only": lambda: vmi_quant.per_block_cast_with_sf_only(XB, "e4m3", (32, 32)),
    "per_block_cast_with_precomputed_sf": lambda: vmi_quant.per_block_cast_with_precomputed_sf(
        XB, "e4m3", (32, 32), torch.rand(4, 8) + 0.5),
    "per_channel_cast-quantized-x": lambda: vmi_quant.per_channel_cast(
        vmi_quant.per_token_cast(XB, "e4m3", 32), "e4m3", 128, round_sf=True, num_per_channels=32,
        use_packed_ue8m0=True, flavor="cuda"),
    "batched_transpose_weight_sf-out": _transpose_into_reused_outputs,
    "per_token_cast_and_cast_back-fp32": lambda: vmi_quant.per_token_cast_and_cast_back(X.float(), "e2m1", 16),
    # test_norm_backward's weightless case (hidden 96, cuda flavor).
    "norm_backward-no-weight": lambda: vmi_quant.norm_backward(
        X[:, :96].contiguous(), X[:, 96:192].contiguous(), None, torch.rand(12) + 0.5, flavor="cuda"),
    # test_swiglu_backward's packed case: H = 256, 32 channels, row weights, the psum layout.
    "swiglu_backward_and_per_token_cast-packed-col-major": lambda: vmi_quant.swiglu_backward_and_per_token_cast(
        vmi_quant.reference.cast(randn((12, 512), 19, torch.bfloat16), "e4m3", (1, 32)), X, "e4m3", 32,
        torch.tensor([12], dtype=torch.int32), torch.rand(12), 2.5, use_tma_aligned_col_major_sf=True,
        round_sf=True, use_packed_ue8m0=True, clamp_value=0.5, do_recompute=True),
    "norm_forward-out": lambda: vmi_quant.norm_forward(
        X, X[0], 1e-6, X.flip(0), 0.3, out=torch.empty_like(X), residual_out=torch.empty_like(X)),
    "norm_forward_and_per_token_cast-3d-out": lambda: vmi_quant.norm_forward_and_per_token_cast(
        X.view(2, 6, 256), X[0], 1e-6, "e4m3", 32, X.flip(0).view(2, 6, 256), 0.3, use_tma_aligned_col_major_sf=True,
        round_sf=True, use_packed_ue8m0=True, with_out_bf16=True,
        out=(torch.empty(2, 6, 256, dtype=torch.float8_e4m3fn), None)),
    "norm_forward_and_per_token_cast-mega": _norm_cast_with_mega_moe_sf,
    # The mutable clamped_count, the psum layout (one expert over every row: no padding rows, whose
    # outputs are left unwritten) and a packed column-major SF.
    "swiglu_forward-clamped_count": lambda: vmi_quant.swiglu_forward(
        X, "bf16", torch.tensor([12], dtype=torch.int32), torch.rand(12), 2.5, 0.5, torch.zeros(4, dtype=torch.int64)),
    "swiglu_forward_and_per_token_cast-clamped_count": lambda: vmi_quant.swiglu_forward_and_per_token_cast(
        X, "e4m3", 32, torch.tensor([12], dtype=torch.int32), torch.rand(12), 2.5, use_tma_aligned_col_major_sf=True,
        round_sf=True, use_packed_ue8m0=True, clamp_value=0.5, clamped_count=torch.zeros(4, dtype=torch.int64)),
    "moe_topk_gate_forward-mutable": _gate_with_mutable_arguments,
    "moe_topk_gate_backward-out": _backward_with_out,
    "moe_topk_gate_autograd": _gate_with_autograd,
    "mhc_head_compute_mix-out": _head_mix_into_outputs,
    "mhc_pre_split_mixes-out": _split_mixes_into_outputs,
    "mhc_norm_fn-out": _norm_fn_stages_into_given_outputs,
    "mhc_sinkhorn_fwd-out": lambda: vmi_mhc.mhc_sinkhorn_fwd(COMB, torch.empty_like(COMB), 3, 1e-2),
    "mhc_sinkhorn_bwd-out": lambda: vmi_mhc.mhc_sinkhorn_bwd(COMB.flip(0), COMB, torch.empty_like(COMB), 3, 1e-2),
    "mhc_pre_norm_fn_gemm-out": _prenorm_gemm_into_given_outputs,
    # Preallocated outputs (the .out overload) and 3 splits, at the registry sample's hidden size
    # (test_pre_big_fuse's 1280).
    "mhc_pre_big_fuse_fwd-out": lambda: vmi_mhc.mhc_pre_big_fuse_fwd(
        randn((3, 12, 24), 4), torch.rand(3, 12) + 0.5, MIX_SCALE, MIX_BASE, randn((12, 4, 1280), 20, torch.bfloat16),
        torch.empty(12, 4), torch.empty(12, 16), torch.empty(12, 1280, dtype=torch.bfloat16), 1e-6, 1e-2, 1e-6, 2.0,
        3, 3),
    # The preallocated outputs of the kernel-level mHC API (the .out overloads), a hidden size with a
    # register tail, and mix as (T, n, 1); 4 streams, as the mHC tests (their kernels).
    "expand_to_mhc_fwd-out": lambda: vmi_mhc.expand_to_mhc_fwd(
        X[:, :200].contiguous(), torch.empty(12, 4, 200, dtype=torch.bfloat16)),
    "expand_to_mhc_bwd-out": lambda: vmi_mhc.expand_to_mhc_bwd(
        X.view(12, 4, 64), torch.empty(12, 64, dtype=torch.bfloat16)),
    "mhc_pre_apply_mix_fwd-out": lambda: vmi_mhc.mhc_pre_apply_mix_fwd(
        X.view(12, 4, 64), torch.rand(12, 4, 1), torch.empty(12, 64, dtype=torch.bfloat16)),
    # A preallocated output, and 3-D token dims with a residual that is not contiguous (hidden 64,
    # the registry sample's).
    "mhc_post_fwd-out": lambda: vmi_mhc.mhc_post_fwd(
        randn((2, 3, 64), 7, torch.bfloat16), randn((2, 3, 4, 128), 4, torch.bfloat16)[..., ::2],
        randn((2, 3, 4, 1), 5), randn((2, 3, 4, 4), 6), out=torch.empty(2, 3, 4, 64, dtype=torch.bfloat16)),
    # One layer without a post update (pre_apply_mix's kernel), 3-D token dims, 4 streams.
    "mhc_multilayer_recompute-one-layer": lambda: vmi_mhc.mhc_multilayer_recompute(
        X.view(2, 3, 4, 128), [torch.rand(2, 3, 4)], [], [], [], [torch.empty(2, 3, 128, dtype=torch.bfloat16)], []),
}
SAMPLES = {**{name: _registry_call(name) for name in sorted(OPS)}, **VARIANTS}


def _recorded(sample: str):
    with _Recorder() as recorder:
        SAMPLES[sample]()
    assert recorder.calls, f"{sample} made no vmi op call"
    return recorder.calls


def test_every_declared_op_has_a_sample():
    covered = set()
    for sample in SAMPLES:
        covered |= {func.name().split("::")[1].split(".")[0] for func, _, _ in _recorded(sample)}
    assert covered == set(KERNEL_OPS)


def _has_float8(value) -> bool:
    found = []
    tree_map(lambda t: found.append(isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fn), value)
    return any(found)


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_opcheck(sample):
    for func, args, kwargs in _recorded(sample):
        tests = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
        if _has_float8((args, kwargs)):
            # opcheck's schema test compares values with a multiply that torch lacks for float8 on cpu;
            # the aliasing it would check is the same as the bf16 samples' of the same schema.
            tests = tests[1:]
        torch.library.opcheck(func, args, kwargs, test_utils=tests)


def _metadata(value):
    return tree_map(lambda t: (tuple(t.shape), t.dtype, tuple(t.stride())) if isinstance(t, torch.Tensor) else t,
                    value)


@pytest.mark.parametrize("sample", sorted(SAMPLES))
@pytest.mark.parametrize("mode", ["fake", "meta"])
def test_shapes_without_data(sample, mode):
    """A fake or meta call returns what the real call returns, bar the values."""
    for func, args, kwargs in _recorded(sample):
        real = func(*tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, args), **kwargs)
        if mode == "fake":
            with FakeTensorMode() as fake_mode:
                convert = lambda v: fake_mode.from_tensor(v) if isinstance(v, torch.Tensor) else v  # noqa: E731
                traced = func(*tree_map(convert, args), **tree_map(convert, kwargs))
        else:
            convert = lambda v: v.to("meta") if isinstance(v, torch.Tensor) else v  # noqa: E731
            traced = func(*tree_map(convert, args), **tree_map(convert, kwargs))
            assert all(t.device.type == "meta" for t in traced if isinstance(t, torch.Tensor)) \
                if isinstance(traced, tuple) else traced is None or traced.device.type == "meta"
        assert _metadata(traced) == _metadata(real)


def _one_op_per_family(x, logits, mixes):
    data, sf = vmi_quant.per_token_cast(x, "e4m3", 32)
    restored = vmi_quant.cast_back((data, sf), "bf16", (1, 32))
    # The gate writes the scores into a tensor of the graph (a mutable argument).
    scores = torch.empty_like(logits)
    idx, weights = vmi_moe.moe_topk_gate_forward(logits, K, False, 0, 2.5, 0, scores=scores)
    pre, post, comb = vmi_mhc.mhc_pre_split_mixes_fwd(mixes, MIX_SCALE, MIX_BASE, None, None, None, 2.0, 1e-2)
    return data.view(torch.uint8), sf, restored * 2, idx, weights * 2, scores, pre, post * 2, comb


def _gate_loss(logits):
    _, weights, scores_sum = vmi_moe.moe_topk_gate_autograd(logits, K, False, 0, 1.5, 0, num_sequences=2)
    return (weights * torch.arange(float(K))).sum() + scores_sum.square().sum()


def test_compile_fullgraph_backward_gives_eager_gradient():
    """The gate's registered backward is traced into the compiled backward graph."""
    torch._dynamo.reset()
    eager_logits, compiled_logits = LOGITS.clone().requires_grad_(), LOGITS.clone().requires_grad_()
    _gate_loss(eager_logits).backward()
    torch.compile(_gate_loss, fullgraph=True)(compiled_logits).backward()
    assert torch.equal(compiled_logits.grad, eager_logits.grad)


def test_compile_fullgraph_gives_eager_bits():
    """No graph break (the lock and the kernel cache stay inside the ops) and the same bits."""
    torch._dynamo.reset()
    compiled = torch.compile(_one_op_per_family, fullgraph=True)
    eager = _one_op_per_family(X, LOGITS, MIXES)
    for got, want in zip(compiled(X, LOGITS, MIXES), eager, strict=True):
        assert torch.equal(got, want)
