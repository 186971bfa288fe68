"""Launch plans (``vmi_core.plan``): a repeat cpu call of a signature runs from what its first call
did, and gives what a call without plans gives; what a plan cannot repeat is never planned."""

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
from vmi_quant import cast_back, per_token_cast, per_token_cast_and_cast_back, swiglu_forward


def _layout(t: torch.Tensor):
    return t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.untyped_storage().nbytes()


def _per_token_cast(x):
    # A column-major view of a padded, packed UE8M0 SF: outputs that are views, not whole allocations.
    return per_token_cast(x, "e2m1", 32, use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True,
                          target="cpu")


def test_planned_calls_match_unplanned_ones_across_row_ranges(monkeypatch):
    monkeypatch.setenv(THREADS_ENV, "2")
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


def test_the_environment_is_part_of_the_signature(monkeypatch):
    x = torch.randn(4, 256, generator=generator(5)).to(torch.bfloat16)
    words = {}
    for flavor in ("ascend", "cuda", "ascend"):
        monkeypatch.setenv(FLAVOR_ENV, flavor)
        words[flavor] = per_token_cast(x, "e4m3", 32, round_sf=True, use_packed_ue8m0=True, target="cpu")[1].dtype
    assert words == {"ascend": torch.int16, "cuda": torch.int32}


def test_calls_that_write_an_argument_and_other_targets_have_no_plans():
    x = torch.randn(2, 128).to(torch.bfloat16)
    per_token_cast_and_cast_back(x, "e4m3", 32)
    assert "no argument the op writes" in KERNEL_OPS["per_token_cast_and_cast_back"].plan_of(x, "e4m3", 32,
                                                                                            target="cpu")
    per_token_cast(x, "e4m3", 32, target="torch")
    assert "cpu target" in KERNEL_OPS["per_token_cast"].plan_of(x, None, "e4m3", 32, target="torch")


def test_ops_read_tensor_values_only_where_a_plan_sees_it():
    """``tolist`` and ``numpy`` run no torch operation a plan's recorder could see: outside the
    references and the tools, values are read through ``with_values``."""
    root = Path(__file__).resolve().parents[1] / "packages"
    readers = []
    for path in sorted(root.glob("*/src/**/*.py")):
        parts = set(path.relative_to(root).parts)
        if parts & {"reference", "tools", "ascend_sim"} or path.name == "plan.py":
            continue
        text = path.read_text()
        readers += [f"{path.relative_to(root)}: {reader}" for reader in (".tolist()", ".numpy()") if reader in text]
    assert not readers, readers
