"""Every op of the ``vmi`` command has a torch baseline for ``vmi bench`` (the ``vmi.baselines`` entry
points of vmi-devkit), and a baseline that claims to match the reference does, whole and in 128-row
chunks, in both flavors."""

from __future__ import annotations

import pytest

from vmi_core.tools.bench import CHUNK_ROWS, discover_baselines
from vmi_core.tools.registry import discover

OPS = {op.name: op for op in discover().values()}
BASELINES = discover_baselines()
# Besides the defaults: the options whose baselines take another path.
VARIANTS = {
    "per_token_cast": [["fmt=e2m1"], ["round_sf=true", "use_packed_ue8m0=true", "use_tma_aligned_col_major_sf=true"],
                       ["use_e4m3_sf=true", "num_per_channels=16"], ["stochastic_cast=true"]],
    "per_token_cast_and_cast_back": [["fmt=e2m1", "in_dtype=fp32"], ["round_sf=true"]],
    "per_block_cast": [["fmt=e2m1", "block_m=32", "block_k=32"], ["round_sf=true", "use_packed_ue8m0=true"]],
    "per_channel_cast": [["num_per_tokens=128", "round_sf=true", "use_packed_ue8m0=true"],
                         ["in_dtype=e4m3", "num_per_channels=32", "round_sf=true"], ["in_dtype=fp32"]],
    "per_block_cast_lossless": [["use_packed_ue8m0=true", "use_tma_aligned_col_major_sf=true"]],
    "cast": [["in_dtype=bf16", "dtype=e4m3"], ["stochastic_rounding=true"]],
    "cast_back": [["x_fmt=e2m1"], ["round_sf=true", "use_packed_ue8m0=true", "block_m=32", "block_k=1"]],
    "batched_transpose_weight_sf": [["block_size=128", "num_groups=3", "transpose_sf1=true"]],
    "reduce_fused": [["dtype=fp32", "fp8_format=e4m3", "with_x_sf=true", "with_sf=true"],
                     ["dtype=e4m3", "with_weights=false"]],
    "norm_forward": [["use_residual=true", "use_weight=false", "in_dtype=fp32"]],
    "norm_forward_and_per_token_cast": [["use_residual=true", "round_sf=true", "use_packed_ue8m0=true",
                                         "use_tma_aligned_col_major_sf=true", "with_out_bf16=true"]],
    "moe_topk_gate": [["num_shared_experts=1", "bias=false"]],
    "swiglu_forward": [["fmt=fp32", "experts=0", "weights=false", "clamp=false"]],
    "swiglu_forward_and_per_channel_cast_and_transpose": [["num_per_tokens=128", "round_sf=true",
                                                            "without_transpose=true", "clamp=false"]],
    "swiglu_forward_and_per_token_cast": [["num_per_channels=128", "round_sf=true", "use_packed_ue8m0=true",
                                           "use_tma_aligned_col_major_sf=true"]],
    "moe_topk_gate_backward": [["num_sequences=0"]],
}
CASES = [(name, options) for name in sorted(OPS) for options in [[], *VARIANTS.get(name, [])]]


def small_shape(op) -> tuple[int, ...]:
    """Two 128-row chunks; per_block_cast needs multiples of 128. The trailing sizes (none for
    ``(tokens,)`` shapes) at most 256."""
    return 2 * CHUNK_ROWS, *(min(size, 256) for size in op.default_shape[1:])


def test_every_op_has_a_baseline_and_every_baseline_an_op():
    assert OPS
    assert sorted(OPS) == sorted(BASELINES)


@pytest.mark.parametrize(("name", "pairs"), CASES, ids=[f"{n}-{'-'.join(p) or 'default'}" for n, p in CASES])
def test_baseline_runs_and_holds_its_claim(name, pairs):
    op = OPS[name]
    options = op.parse_options(pairs)
    baseline = BASELINES[name](op, options)
    assert baseline.what
    inputs = op.make_inputs(small_shape(op), options, 0)
    for flavor in ("ascend", "cuda"):
        expected = op.reference(inputs, options, flavor)
        for rows in (None, CHUNK_ROWS):
            mismatches = op.check(baseline.run(inputs, flavor, rows), expected)
            if baseline.same_bits:
                assert not mismatches, f"{name} {flavor} rows={rows}:\n" + "\n".join(mismatches)
