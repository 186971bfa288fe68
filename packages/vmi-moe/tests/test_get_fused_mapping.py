"""get_fused_mapping on the cpu target (both flavors) and on ascend-sim against the reference, bit
for bit, and against the layout's definition directly.

Every output is int32 and compared with ``assert_bitwise_equal`` (dtype, shape, strides, bits).
Independently of the reference (``check_layout``): ranges in expert order from row 0, each its
expert's slot count rounded up to ``alignment``; slots in ascending flat index within a range; the
three row maps and ``token_topk_to_pos`` inverse to each other; padding ``-1``. Token counts cover
the empty batch, one token, both sides of a work tile and several tiles split over cpu threads;
routings with unused slots, a token sending several slots to one expert, every slot to one expert,
and experts with no slot. Errors: each bad argument before any kernel runs, and what only the
kernel sees (an id outside ``[-1, E)``, too few rows) after it.
"""

import pytest
import torch

from vmi_core.cpu_parallel import THREADS_ENV
from vmi_core.tools.source_checks import assert_vector_regions, barriers_in_thread_guards, dma_counts
from vmi_core.tools.testing import assert_bitwise_equal
from vmi_devkit.cases.moe_cases import id_routing
from vmi_devkit.cuda import check_cuda_source
from vmi_moe import get_fused_mapping, get_fused_mapping_parallel
from vmi_moe.kernels.get_fused_mapping import (
    FusedLayoutSpec,
    FusedMappingSpec,
    build_fused_mapping_count,
    build_fused_mapping_layout,
    build_fused_mapping_place,
)
from vmi_moe.ops.get_fused_mapping import rows_bound
from vmi_moe.reference import get_fused_mapping as reference_mapping

# (E, K): the V4 gate's 256 x 8, and 72 x 6 (E not a multiple of 8).
SIZES = [(256, 8), (72, 6)]
BLOCK_M = FusedMappingSpec(256, 8).block_m


def check_layout(outputs, topk_idx: torch.Tensor, num_experts: int, alignment: int) -> None:
    """The layout's definition, checked without the reference."""
    pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, start, end, sizes = (
        t.tolist() for t in outputs[:7])
    flat = topk_idx.flatten().tolist()
    num_topk = topk_idx.shape[1]
    row = 0
    for e in range(num_experts):
        slots = [s for s, expert in enumerate(flat) if expert == e]
        assert (start[e], end[e], sizes[e]) == (row, row + sizes[e], end[e] - start[e])
        assert sizes[e] % alignment == 0 and len(slots) <= sizes[e] < len(slots) + alignment
        for offset, slot in enumerate(slots):
            assert token_topk_to_pos[slot // num_topk][slot % num_topk] == row + offset
        for p in range(row, row + sizes[e]):
            used = p - row < len(slots)
            assert pos_to_expert[p] == (e if used else -1)
            assert pos_to_token_topk[p] == (slots[p - row] if used else -1)
            assert pos_to_token[p] == (slots[p - row] // num_topk if used else -1)
        row += sizes[e]
    assert pos_to_expert[row:] == pos_to_token[row:] == pos_to_token_topk[row:] == [-1] * (len(pos_to_expert) - row)
    assert all(token_topk_to_pos[s // num_topk][s % num_topk] == -1 for s, e in enumerate(flat) if e < 0)


def check_against_reference(outputs, topk_idx, num_experts, alignment, what):
    expected = reference_mapping(topk_idx, num_experts, outputs[0].shape[0], alignment)
    names = ("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos", "expert_start", "expert_end",
             "num_tokens_per_expert")
    for name, actual, wanted in zip(names, outputs, expected, strict=False):
        assert_bitwise_equal(actual, wanted, f"{what} {name}")


@pytest.mark.parametrize(("num_experts", "num_topk"), SIZES)
@pytest.mark.parametrize("alignment", [1, 16, 128])
def test_matches_reference_and_definition(num_experts, num_topk, alignment):
    for num_tokens in (0, 1, BLOCK_M - 1, BLOCK_M + 1, 3 * BLOCK_M + 5):
        for kind in ("random", "repeats"):
            idx = id_routing(num_tokens, num_experts, num_topk, num_tokens + alignment, kind)
            outputs = get_fused_mapping(idx, num_experts, 0, alignment, target="cpu")
            what = f"E={num_experts} K={num_topk} A={alignment} T={num_tokens} {kind}"
            check_against_reference(outputs, idx, num_experts, alignment, what)
            check_layout(outputs, idx, num_experts, alignment)
            assert outputs[7] == outputs[6].tolist()


@pytest.mark.parametrize("kind", ["one id", "unused"])
def test_degenerate_routings(kind):
    idx = id_routing(2 * BLOCK_M + 3, 72, 6, 0, kind)
    for flavor in ("ascend", "cuda"):
        outputs = get_fused_mapping(idx, 72, 0, 64, target="cpu", flavor=flavor)
        check_against_reference(outputs, idx, 72, 64, f"{kind} {flavor}")
        check_layout(outputs, idx, 72, 64)


def test_row_counts_and_trimming():
    idx = id_routing(BLOCK_M + 7, 72, 6, 1)
    trimmed = get_fused_mapping(idx, 72, 0, 16, target="cpu")
    used = sum(trimmed[7])
    assert trimmed[0].shape == (used,) and trimmed[0].is_contiguous()
    # No sync: the untrimmed maps, the most any routing can need, and no list.
    untrimmed = get_fused_mapping(idx, 72, 0, 16, True, target="cpu")
    assert untrimmed[0].shape == (rows_bound(idx.numel(), 72, 16),) and untrimmed[7] == []
    for given in (used, used + 5):
        exact = get_fused_mapping(idx, 72, given, 16, target="cpu")
        assert exact[0].shape == (given,) and exact[7] == []
        check_against_reference(exact, idx, 72, 16, f"N={given}")
    for a, b in zip(trimmed[:3], untrimmed[:3], strict=True):
        assert torch.equal(a, b[:used]) and (b[used:] == -1).all()


def test_rows_do_not_depend_on_cpu_threads(vmi_env):
    idx = id_routing(8 * BLOCK_M + 9, 256, 8, 2)
    outputs = {}
    for threads in ("1", "2", "3"):
        vmi_env.setenv(THREADS_ENV, threads)
        outputs[threads] = get_fused_mapping(idx, 256, 0, 128, target="cpu")
    for threads in ("2", "3"):
        for a, b in zip(outputs["1"][:7], outputs[threads][:7], strict=True):
            assert_bitwise_equal(b, a, f"{threads} threads")


@pytest.mark.parametrize("num_tokens", [0, 1, BLOCK_M + 1])
def test_ascend_sim(num_tokens):
    idx = id_routing(num_tokens, 72, 6, num_tokens, "repeats" if num_tokens == 1 else "random")
    outputs = get_fused_mapping_parallel(idx, 72, 0, 16, target="ascend-sim")
    check_against_reference(outputs, idx, 72, 16, f"ascend-sim T={num_tokens}")
    check_layout(outputs, idx, 72, 16)


@pytest.mark.parametrize("target", ["cpu", "ascend-sim"])
@pytest.mark.parametrize(("bad", "match"), [
    (72, "topk_idx holds ids outside"),
    (-2, "topk_idx holds ids outside"),
    (2**32 + 3, "topk_idx holds ids outside"),  # low word in range, high word not 0
])
def test_kernel_flags_bad_expert_ids(target, bad, match):
    idx = id_routing(BLOCK_M + 3, 72, 6, 3)
    idx[BLOCK_M + 1, 2] = bad
    with pytest.raises(ValueError, match=match):
        get_fused_mapping(idx, 72, 0, 16, target=target)
    with pytest.raises(ValueError, match="outside"):
        get_fused_mapping(idx, 72, 0, 16, target="torch")


@pytest.mark.parametrize("target", ["cpu", "ascend-sim"])
def test_too_few_rows(target):
    idx = id_routing(40, 72, 6, 4)
    needed = sum(get_fused_mapping(idx, 72, 0, 16, target="cpu")[7])
    with pytest.raises(ValueError, match="num_expanded_tokens is too small"):
        get_fused_mapping(idx, 72, needed - 1, 16, target=target)
    with pytest.raises(ValueError, match="num_expanded_tokens .* is too small"):
        get_fused_mapping(idx, 72, needed - 1, 16, target="torch")


IDX = id_routing(4, 8, 2, 5)


@pytest.mark.parametrize(("args", "error", "match"), [
    ((IDX.int(), 8, 0, 4), TypeError, "topk_idx"),
    ((IDX.flatten(), 8, 0, 4), ValueError, "topk_idx"),
    ((IDX.t(), 8, 0, 4), ValueError, "topk_idx"),
    ((torch.zeros(4, 0, dtype=torch.int64), 8, 0, 4), ValueError, "topk_idx must have 1 to 32 columns"),
    ((torch.zeros(4, 33, dtype=torch.int64), 40, 0, 4), ValueError, "topk_idx must have 1 to 32 columns"),
    ((IDX, 0, 0, 4), ValueError, "num_experts"),
    ((IDX, 8.0, 0, 4), TypeError, "num_experts"),
    ((IDX, 8, -1, 4), ValueError, "num_expanded_tokens"),
    ((IDX, 8, 0, 0), ValueError, "alignment"),
    ((IDX, 8, 0, 4, 1), TypeError, "force_no_sync"),
    ((torch.zeros(2**20, 32, dtype=torch.int64, device="meta"), 65536, 0, 65536), ValueError, "32-bit"),
])
def test_bad_arguments_raise_before_any_kernel(args, error, match):
    with pytest.raises(error, match=match):
        get_fused_mapping(*args, target="cpu")


def test_lowering():
    spec = FusedMappingSpec(256, 8)
    for build, kernel_spec, name in ((build_fused_mapping_count, spec, "fused_mapping_count_kernel"),
                                     (build_fused_mapping_layout, FusedLayoutSpec(256), "fused_mapping_layout_kernel"),
                                     (build_fused_mapping_place, spec, "fused_mapping_place_kernel")):
        src = build.source(kernel_spec, "ascend")
        assert f"__global__ __vector__ void {name}" in src
        # One lane walks the slots: counters, rows and the maps at computed addresses.
        assert_vector_regions(src, simd=0, simt=1)
        assert barriers_in_thread_guards(src) == 0
        gm_to_ub, ub_to_gm = dma_counts(src)
        assert (gm_to_ub, ub_to_gm) >= ((1, 0) if build is build_fused_mapping_count else
                                        (0, 0) if build is build_fused_mapping_layout else (1, 1)), name


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_lowering_compiles():
    spec = FusedMappingSpec(256, 8)
    check_cuda_source(build_fused_mapping_place.source(spec, "cuda"))
