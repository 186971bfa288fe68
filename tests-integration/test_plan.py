"""Launch plans (``vmi_core.plan``): a repeat cpu call of a signature runs from what its first call
did, and gives and writes what a call without plans gives and writes; what a plan cannot repeat is
never planned."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vmi_core.cpu_parallel import THREADS_ENV
from vmi_core.library import KERNEL_OPS
from vmi_core.plan import Plan, invalidate
from vmi_core.targets import FLAVOR_ENV
from vmi_core.tools.overhead import plans_off
from vmi_core.tools.testing import assert_bitwise_equal, generator
from vmi_moe import topk_gate
from vmi_moe.ops.reduce_fused import placement
from vmi_quant import cast_back, per_token_cast, swiglu_forward


def _layout(t: torch.Tensor):
    return t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.untyped_storage().nbytes()


def _per_token_cast(x):
    # A column-major view of a padded, packed UE8M0 SF: outputs that are views, not whole allocations.
    return per_token_cast(x, "e2m1", 32, use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True,
                          target="cpu")


def test_planned_calls_match_unplanned_ones_across_row_ranges(vmi_env):
    vmi_env.setenv(THREADS_ENV, "2")
    op = KERNEL_OPS["per_token_cast"]
    inputs = [torch.randn(300, 512, generator=generator(seed)).to(torch.bfloat16) for seed in range(3)]
    planned = [_per_token_cast(x) for x in inputs]
    plan = op.plan_of(inputs[0], None, "e2m1", 32, None, True, True, True, target="cpu")
    assert isinstance(plan, Plan) and any(len(getattr(a, "ranges", ())) == 2 for a in plan.actions), plan
    with plans_off(op):
        unplanned = [_per_token_cast(x) for x in inputs]
    for got, want in zip(planned, unplanned, strict=True):
        for name, g, w in zip(("data", "sf"), got, want, strict=True):
            assert _layout(g) == _layout(w), name
            assert_bitwise_equal(g, w, name)


def test_a_planned_call_checks_the_values_its_kernel_flags():
    scores = torch.randn(5, 64, generator=generator(1))
    first = topk_gate(scores, 4, target="cpu")
    assert isinstance(KERNEL_OPS["topk_gate"].plan_of(scores, 4, target="cpu"), Plan)
    bad = scores.clone()
    bad[3, 7] = float("nan")
    with pytest.raises(ValueError, match="scores contains non-finite values"):
        topk_gate(bad, 4, target="cpu")
    assert torch.equal(topk_gate(scores, 4, target="cpu"), first)


def test_a_planned_call_repeats_the_steps_that_read_values():
    """swiglu_forward checks its psum layout and zeroes the rows it leaves out by the layout's values:
    a planned call does both by its own layout."""
    x = torch.randn(96, 256, generator=generator(2)).to(torch.bfloat16)
    op = KERNEL_OPS["swiglu_forward"]
    layouts = ([10, 40, 40, 70], [0, 5, 90, 96], [3, 3, 3, 3])
    got = [swiglu_forward(x, "bf16", torch.tensor(ends, dtype=torch.int32), target="cpu") for ends in layouts]
    assert isinstance(op.plan_of(x, "bf16", torch.tensor(layouts[0], dtype=torch.int32), target="cpu"), Plan)
    with plans_off(op):
        for ends, planned in zip(layouts, got, strict=True):
            assert_bitwise_equal(planned, swiglu_forward(x, "bf16", torch.tensor(ends, dtype=torch.int32),
                                                         target="cpu"), f"psum {ends}")
    with pytest.raises(ValueError, match="must not decrease"):
        swiglu_forward(x, "bf16", torch.tensor([10, 40, 30, 70], dtype=torch.int32), target="cpu")


def test_inputs_sharing_memory_are_read_where_they_lie():
    """A kernel pointer in two inputs at once cannot be placed: that signature runs unplanned. A plan
    made from separate inputs reads each input of a later call where it lies, shared or not."""
    rows, cols = 64, 256
    q = torch.randn(rows, cols, generator=generator(3)).to(torch.float8_e4m3fn)
    sf = torch.rand(rows, cols // 128, generator=generator(4)) + 0.5
    buffer = torch.empty(rows * cols + sf.numel() * 4, dtype=torch.uint8)
    shared = (buffer[:rows * cols].view(torch.float8_e4m3fn).view(rows, cols),
              buffer[rows * cols:].view(torch.float32).view(sf.shape))
    shared[0].copy_(q)
    shared[1].copy_(sf)
    want = cast_back((q, sf), "bf16", (1, 128), target="torch")
    for order in ((q, sf), shared), (shared, (q, sf)):
        invalidate()
        for x in order * 2:
            assert_bitwise_equal(cast_back(x, "bf16", (1, 128), target="cpu"), want, "cast_back")


def _aliases(outputs) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(outputs)) for j in range(i + 1, len(outputs))
            if torch._C._is_alias_of(outputs[i], outputs[j])]


def test_outputs_alias_each_other_only_where_the_op_allocated_them_so():
    """Empty allocations all lie at address 0 (norm_forward_and_per_token_cast without a residual or a
    bf16 output returns two empty placeholders): a planned call tells them apart as an unplanned one does."""
    op = KERNEL_OPS["norm_forward_and_per_token_cast"]
    x = torch.randn(4, 256, generator=generator(7)).to(torch.bfloat16)
    planned = [op(x, None, 1e-6, "e4m3", 32, target="cpu") for _ in range(2)]
    assert isinstance(op.plan_of(x, None, 1e-6, "e4m3", 32, target="cpu"), Plan)
    with plans_off(op):
        unplanned = op(x, None, 1e-6, "e4m3", 32, target="cpu")
    assert [_aliases(outputs) for outputs in planned] == [_aliases(unplanned)] * 2


def test_the_environment_is_part_of_the_signature(vmi_env):
    x = torch.randn(4, 256, generator=generator(5)).to(torch.bfloat16)
    words = {}
    for flavor in ("ascend", "cuda", "ascend"):
        vmi_env.setenv(FLAVOR_ENV, flavor)
        words[flavor] = per_token_cast(x, "e4m3", 32, round_sf=True, use_packed_ue8m0=True, target="cpu")[1].dtype
    assert words == {"ascend": torch.int16, "cuda": torch.int32}


def test_other_targets_have_no_plans():
    x = torch.randn(2, 128).to(torch.bfloat16)
    per_token_cast(x, "e4m3", 32, target="torch")
    assert "cpu target" in KERNEL_OPS["per_token_cast"].plan_of(x, None, "e4m3", 32, target="torch")


# Calls that give an argument the op writes in place, one per way an op writes it, with fresh tensors
# from a seed: ``(op, positional arguments, keyword arguments, the tensors the call writes)``.
GATE_BIAS = torch.randn(64, generator=generator(6))


def _moe_topk_gate_scores(seed: int):
    """The scores output: the kernel writes a scratch copy, which is copied in once the flags are clear."""
    logits = torch.randn(5, 64, generator=generator(seed))
    scores = torch.full((5, 64), 7.0)
    args = (logits, 6, False, 0, 2.5, 0, "sqrtsoftplus", None, GATE_BIAS, *[None] * 7, scores)
    return KERNEL_OPS["moe_topk_gate_forward"], args, {}, (scores,)


def _reduce_fused_out(seed: int):
    """``reduce_fused.out``: a preallocated output, written through a scratch copy like the scores."""
    rows = torch.randn(20, 128, generator=generator(seed)).to(torch.bfloat16)
    weights = torch.rand(5, 4, generator=generator(seed + 10))
    out = torch.full((5, 128), 7.0, dtype=torch.bfloat16)
    return KERNEL_OPS["reduce_fused"], (rows, None, weights, placement(5, 4, 20, seed)), {"out": (out,)}, (out,)


def _per_token_cast_and_cast_back(seed: int):
    """An input the kernel reads and rewrites in place, then marks written."""
    x = torch.randn(3, 128, generator=generator(seed)).to(torch.bfloat16)
    return KERNEL_OPS["per_token_cast_and_cast_back"], (x, "e4m3", 32), {}, (x,)


def _norm_backward_weight_grad(seed: int):
    """A gradient the kernel accumulates into, then marks written."""
    g = generator(seed)
    out_grad, x = (torch.randn(4, 256, generator=g).to(torch.bfloat16) for _ in range(2))
    weight = torch.randn(256, generator=g).to(torch.bfloat16)
    rstd = torch.rand(4, generator=g) + 0.5
    weight_grad = torch.randn(256, generator=g)
    return KERNEL_OPS["norm_backward"], (out_grad, x, weight, rstd, None, 1.0, weight_grad), {}, (weight_grad,)


WRITERS = (_moe_topk_gate_scores, _reduce_fused_out, _per_token_cast_and_cast_back, _norm_backward_weight_grad)


def _tensors(result) -> tuple:
    return () if result is None else (result,) if isinstance(result, torch.Tensor) else tuple(result)


def _call(writer, seed: int):
    """The writer's call: its results, the tensors it wrote, and how far their version counters moved."""
    op, args, kwargs, written = writer(seed)
    versions = [t._version for t in written]
    results = op(*args, **kwargs, target="cpu")
    return _tensors(results), written, [t._version - v for t, v in zip(written, versions, strict=True)]


@pytest.mark.parametrize("writer", WRITERS, ids=lambda writer: writer.__name__.strip("_"))
def test_planned_calls_write_their_arguments_as_unplanned_ones(writer):
    """Results and written tensors bit for bit, and the version counters: every call moves them, as
    torch's in-place ops do, so a backward that saved the tensor raises."""
    op, args, kwargs, _ = writer(0)
    planned = [_call(writer, seed) for seed in range(3)]
    assert isinstance(op.plan_of(*args, **kwargs, target="cpu"), Plan), op.plan_of(*args, **kwargs, target="cpu")
    with plans_off(op):
        unplanned = [_call(writer, seed) for seed in range(3)]
    for seed, (got, want) in enumerate(zip(planned, unplanned, strict=True)):
        for what, gots, wants in zip(("result", "written"), got[:2], want[:2], strict=True):
            assert len(gots) == len(wants)
            for k, (g, w) in enumerate(zip(gots, wants, strict=True)):
                assert_bitwise_equal(g, w, f"{what} {k} of call {seed}")
        assert got[2] == want[2] and min(got[2]) >= 1, (seed, got[2], want[2])


@pytest.mark.parametrize("writer,overlapping,error", [
    (_moe_topk_gate_scores, lambda args, _: (*args[:-1], args[0]), "scores shares memory with logits"),
    (_reduce_fused_out, lambda args, kwargs: {"out": (args[0][:5],)}, "out shares memory with x"),
], ids=("scores", "out"))
def test_a_planned_signature_still_refuses_a_written_argument_that_overlaps_an_input(writer, overlapping, error):
    """The overlap is no part of the signature: a repeat call checks it, and runs in full to raise."""
    op, args, kwargs, _ = writer(0)
    for seed in range(2):
        _call(writer, seed)
    assert isinstance(op.plan_of(*args, **kwargs, target="cpu"), Plan)
    changed = overlapping(args, kwargs)
    args, kwargs = (changed, kwargs) if isinstance(changed, tuple) else (args, changed)
    before = args[0].clone()
    with pytest.raises(ValueError, match=error):
        op(*args, **kwargs, target="cpu")
    assert_bitwise_equal(args[0], before, "the input")


def test_a_planned_signature_still_refuses_a_written_argument_that_requires_grad():
    """norm_backward refuses a weight_grad that requires grad in grad mode, and takes it without."""
    op, args, _, (weight_grad,) = _norm_backward_weight_grad(0)
    for seed in range(2):
        _call(_norm_backward_weight_grad, seed)
    weight_grad.requires_grad_()
    with pytest.raises(RuntimeError, match="in-place operation"):
        op(*args, target="cpu")
    with torch.no_grad():
        unplanned_grad = weight_grad.clone()
        x_grad = op(*args, target="cpu")
        with plans_off(op):
            assert_bitwise_equal(x_grad, op(*args[:-1], unplanned_grad, target="cpu"), "x_grad")
    assert_bitwise_equal(weight_grad.detach(), unplanned_grad, "weight_grad")


def test_ops_read_tensor_values_only_where_a_plan_sees_it():
    """``tolist`` and ``numpy`` run no torch operation a plan's recorder could see: outside the
    references and the tools, values are read through ``with_values``. (The meta-package ``vmi``
    declares no op: its block calls the ops as a model does.)"""
    root = Path(__file__).resolve().parents[1] / "packages"
    readers = []
    for path in sorted(root.glob("vmi-*/src/**/*.py")):
        parts = set(path.relative_to(root).parts)
        if parts & {"reference", "tools", "ascend_sim"} or path.name == "plan.py":
            continue
        text = path.read_text()
        readers += [f"{path.relative_to(root)}: {reader}" for reader in (".tolist()", ".numpy()") if reader in text]
    assert not readers, readers
