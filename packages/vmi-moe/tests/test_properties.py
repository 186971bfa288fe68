"""Property tests (hypothesis): the vmi-moe ops on the cpu target against their references.

Criteria are the existing tests' (nothing looser):

* ``topk_gate`` and ``normalize_weight``: bit for bit against ``stable_topk`` / the reference
  ``normalize_weight`` (``assert_bitwise_equal``);
* ``moe_topk_gate_forward``: end to end against the reference (its own scores, the torch twin's),
  indices, weights, ``unmapped_topk_idx`` and scores bit for bit; the scores also through
  ``moe_cases.assert_scores_exact``; the reference-free token classes;
* ``moe_topk_gate_backward``: the spec's rtol/atol and the element-wise rounding bound of
  ``moe_backward_cases.assert_matches_reference``, +0.0 rows for unrouted tokens;
* ``get_fused_mapping``: every output bit for bit against the reference, over routings that crowd
  a few experts or spread over all, unused slots, drawn alignments and row counts;
* ``topk_sum_and_topk_group_idx``: bit for bit against the reference, over scaled and tied data
  with special finite values and ``-inf``;
* ``group_count``, ``aux_fi``: bit for bit against the references;
* ``reduce_fused``: bit for bit against the reference (NaNs by position), over every input and
  output format, with and without weights and scales, unused and repeated positions; a bad
  position must raise;
* ``expand_to_fused``, ``expand_to_fused_with_sf``: bit for bit against the reference over any bit
  patterns, every data and SF format and layout; corrupted mappings must raise;
* ``top2_sum_gate``: indices, weights and ``unmapped_topk_idx`` bit for bit against the reference over
  the scoring functions, groups, shared experts, masks, fixed routing, replica maps and EP/TP ranks;
  non-finite logits must raise and leave ``unmapped_topk_idx`` unchanged;
* ``mask_indices_by_tp``, ``inplace_unique_group_indices``: bit for bit against the references over
  the whole 32-bit id and rank ranges; ids out of range must raise (the in-place op's input then
  unchanged).

Drawn: token counts (0, 1, both sides of work tiles), gate options, data with ties and special
finite values (signed zeros, subnormals, huge magnitudes); mostly finite. A non-finite score
(``topk_gate``) or logit of a routed token (the gate) must raise ``ValueError`` (README), which is
asserted when drawn (one example in eight); the backward gets the forward's finite scores only.

Each property runs with the profile's budget over a few kernels in the normal run and under
``@pytest.mark.slow`` with at least ``SLOW_EXAMPLES`` examples over more specialisations.
Profiles and replaying failures: ``vmi_devkit.strategies``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vmi_core.tools.testing import assert_bitwise_equal
from vmi_devkit.cases.moe_backward_cases import CASES as BACKWARD_CASES
from vmi_devkit.cases.moe_backward_cases import FULL_CASES as BACKWARD_FULL_CASES
from vmi_devkit.cases.moe_backward_cases import assert_matches_reference, assert_positive_zero_rows, gate_data, run
from vmi_devkit.cases.moe_cases import (
    GateCase,
    assert_scores_exact,
    assert_token_classes,
    gate_inputs,
    run_kernel,
    run_reference,
)
from vmi_devkit.cases.moe_cases import with_ties as tie_rows
from vmi_devkit.strategies import (
    assert_every_option_value_drawn,
    drawn_values,
    few_settings,
    load_profile,
    seeds,
    slow_settings,
)
from vmi_moe import (
    aux_fi,
    expand_to_fused,
    expand_to_fused_with_sf,
    get_fused_mapping,
    group_count,
    inplace_unique_group_indices,
    mask_indices_by_tp,
    normalize_weight,
    reduce_fused,
    top2_sum_gate,
    topk_gate,
    topk_sum_and_topk_group_idx,
)
from vmi_moe.ops.reduce_fused import placement
from vmi_moe.ops.top2_sum_gate import demo_map
from vmi_moe.reference import aux_fi as reference_aux_fi
from vmi_moe.reference import expand_to_fused as reference_expand
from vmi_moe.reference import get_fused_mapping as reference_mapping
from vmi_moe.reference import group_count as reference_group_count
from vmi_moe.reference import mask_indices_by_tp as reference_mask
from vmi_moe.reference import normalize_weight as reference_normalize
from vmi_moe.reference import reduce_fused as reference_reduce_fused
from vmi_moe.reference import stable_topk
from vmi_moe.reference import top2_sum_gate as reference_top2
from vmi_moe.reference import topk_sum_and_topk_group_idx as reference_groups
from vmi_moe.reference import unique_group_indices as reference_unique

# The default-budget tests run in the normal test command; their `slow` twins (>= 1000 examples
# each) run under `nox -s slow`, and CI's rotating share of the slow sweeps leaves them out.
pytestmark = [pytest.mark.properties]


load_profile()

F32_MAX = 3.4028234663852886e38
FINITE_SPECIALS = [0.0, -0.0, 2.0**-149, -(2.0**-149), 1.1754942e-38, -F32_MAX, F32_MAX, 1e30, -1e30, 100.0, -100.0]
NONFINITE = [float("nan"), float("inf"), float("-inf")]


def token_counts(edges=(0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129), limit=300):
    return st.one_of(st.sampled_from(list(edges)), st.integers(0, limit))


def sprinkle(data, x: torch.Tensor, specials, most: int = 8) -> torch.Tensor:
    """``x`` with up to ``most`` drawn values of ``specials`` at drawn positions."""
    if not x.numel():
        return x
    n = data.draw(st.integers(0, most), label="num specials")
    if n:
        where = data.draw(st.lists(st.integers(0, x.numel() - 1), min_size=n, max_size=n), label="positions")
        what = data.draw(st.lists(st.sampled_from(specials), min_size=n, max_size=n), label="specials")
        x = x.clone()
        x.view(-1)[torch.tensor(where)] = torch.tensor(what, dtype=x.dtype)
    return x


def one_nonfinite(data, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
    """Drawn rarely: a copy of ``x`` with one NaN/+-inf in one of ``rows`` (None when not drawn or no row)."""
    candidates = rows.nonzero().reshape(-1)
    if not len(candidates) or not data.draw(st.integers(0, 7).map(lambda v: v == 0), label="nonfinite"):
        return None
    row = int(candidates[data.draw(st.integers(0, len(candidates) - 1), label="bad row")])
    col = data.draw(st.integers(0, x.shape[1] - 1), label="bad column")
    bad = x.clone()
    bad[row, col] = data.draw(st.sampled_from(NONFINITE), label="bad value")
    return bad


# --- topk_gate ---------------------------------------------------------------------------------------------------

TOPK_DEFAULT = [(72, 6), (36, 32)]
TOPK_ALL = [(256, 8), (384, 6), (72, 6), (36, 1), (36, 32), (32, 6), (64, 6), (96, 6), (16, 6), (108, 6), (128, 6),
            (144, 6), (384, 8), (500, 32), (33, 32), (1, 1), (72, 2), (36, 4), (256, 16)]


def check_topk_gate(data, sizes):
    E, K = data.draw(st.sampled_from(sizes), label="(E, K)")
    T = data.draw(token_counts(), label="tokens")
    seed = data.draw(seeds(), label="seed")
    g = torch.Generator().manual_seed(seed)
    scale = data.draw(st.sampled_from([1.0, 1e-30, 1e30, 2.0**-140]), label="scale")
    x = tie_rows(torch.randn(T, E, generator=g), seed + 1) * scale
    x = sprinkle(data, x, FINITE_SPECIALS)
    flavor = data.draw(st.sampled_from(["ascend", "cuda"]), label="flavor")
    bad = one_nonfinite(data, x, torch.ones(T, dtype=torch.bool))
    if bad is not None:
        with pytest.raises(ValueError, match="scores contains non-finite values"):
            topk_gate(bad, K, target="cpu", flavor=flavor)
        return
    assert_bitwise_equal(topk_gate(x, K, target="cpu", flavor=flavor), stable_topk(x, K), f"E={E} K={K} T={T}")


@given(st.data())
def test_topk_gate(data):
    check_topk_gate(data, TOPK_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_topk_gate_slow(data):
    check_topk_gate(data, TOPK_ALL)


# --- normalize_weight ----------------------------------------------------------------------------------------------

def check_normalize_weight(data, topks, flavors):
    K = data.draw(st.sampled_from(topks), label="K")
    flavor = data.draw(st.sampled_from(flavors), label="flavor")
    T = data.draw(token_counts(), label="rows")
    seed = data.draw(seeds(), label="seed")
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(T, K, generator=g)
    if data.draw(st.booleans(), label="spread"):
        w = w * torch.exp2(torch.randint(-149, 120, (T, K), generator=g).float())
    if data.draw(st.booleans(), label="negative"):
        w = torch.where(torch.rand(T, K, generator=g) < 0.3, -w, w)
    if T and data.draw(st.booleans(), label="zero rows"):
        w[:: data.draw(st.integers(1, 5), label="zero row step")] = 0.0
    w = sprinkle(data, w, FINITE_SPECIALS).contiguous()
    d, n = normalize_weight(w, target="cpu", flavor=flavor)
    ref_d, ref_n = reference_normalize(w, flavor)
    assert_bitwise_equal(d, ref_d, f"K={K} {flavor} T={T} denominator")
    assert_bitwise_equal(n, ref_n, f"K={K} {flavor} T={T} weights")


NORMALIZE_TOPK_ALL = list(range(1, 33))


@given(st.data())
def test_normalize_weight(data):
    check_normalize_weight(data, [6, 9], ["ascend", "cuda"])


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_normalize_weight_slow(data):
    check_normalize_weight(data, NORMALIZE_TOPK_ALL, ["ascend", "cuda"])


# --- moe_topk_gate_forward -------------------------------------------------------------------------------------------

ALL = dict(mask=True, bias=True, image=True, fixed=True, force=True)
GATE_DEFAULT = [GateCase(256, 8, S=2, dup=3, flavor="ascend", **ALL), GateCase(72, 6, flavor="cuda", mask=True,
                                                                              bias=True)]
GATE_ALL = [
    *GATE_DEFAULT,
    GateCase(384, 6, S=1, dup=1, flavor="cuda", **ALL),
    GateCase(72, 6, flavor="ascend"),
    GateCase(256, 8, flavor="cuda"),
    GateCase(72, 6, flavor="ascend", mask=True, bias=True),
    GateCase(36, 6, S=2, flavor="cuda", image=True, unmapped=True),
    GateCase(72, 1, S=1, dup=3, flavor="cuda", mask=True, force=True),
    GateCase(36, 32, flavor="ascend", fixed=True, force=True),
    GateCase(72, 2, flavor="ascend", bias=True),
    GateCase(64, 4, S=1, flavor="cuda", mask=True),
    GateCase(256, 16, S=2, flavor="ascend", bias=True, force=True),
]


def check_gate(data, cases):
    case = data.draw(st.sampled_from(cases), label="case")
    T = data.draw(token_counts(limit=200), label="tokens")
    ep_rank = data.draw(st.sampled_from([0, 3, 2**31 - 1]), label="ep_rank")
    inp = gate_inputs(case, T, data.draw(seeds(), label="seed"), padded=min(T, data.draw(st.integers(0, 3))))
    inp.logits = sprinkle(data, inp.logits, FINITE_SPECIALS)
    bad = one_nonfinite(data, inp.logits, inp.routed)
    if bad is not None:
        inp.logits = bad
        with pytest.raises(ValueError, match="logits contains non-finite values"):
            run_kernel(case, inp, ep_rank)
        return
    what = f"{case.id} T={T} ep_rank={ep_rank}"
    idx, weights, unmapped, sc = run_kernel(case, inp, ep_rank)
    ref_idx, ref_w, ref_un, ref_sc = run_reference(case, inp, ep_rank)
    assert_bitwise_equal(idx, ref_idx, f"{what} topk_idx")
    assert_bitwise_equal(weights, ref_w, f"{what} topk_weights")
    if unmapped is not None:
        assert_bitwise_equal(unmapped, ref_un, f"{what} unmapped_topk_idx")
    if sc is not None:
        assert_bitwise_equal(sc, ref_sc, f"{what} scores (0 for unrouted tokens)")
        assert_scores_exact(sc, inp, case.flavor)
    assert_token_classes(case, inp, idx, weights, unmapped, sc)


@given(st.data())
def test_moe_topk_gate_forward(data):
    check_gate(data, GATE_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_moe_topk_gate_forward_slow(data):
    check_gate(data, GATE_ALL)


# --- moe_topk_gate_backward ------------------------------------------------------------------------------------------

def check_backward(data, cases):
    case = data.draw(st.sampled_from(cases), label="case")
    num_seqs = data.draw(st.integers(1, 4), label="sequences")
    per_seq = data.draw(st.one_of(st.sampled_from([0, 1, 5, 16, 33]), st.integers(0, 80)), label="tokens per seq")
    T = num_seqs * per_seq
    d = gate_data(case, T, num_seqs, data.draw(seeds(), label="seed"))
    label = f"{case} T={T} Nseq={num_seqs}"
    # Finite data only: the backward documents no check of non-finite scores (the forward's own scores
    # are finite), so there is no contract to test for them.
    got = run(case, d)
    assert_matches_reference(got, d.args(), d.aux(case), label)
    assert_positive_zero_rows(got, d.dead, label)


@given(st.data())
def test_moe_topk_gate_backward(data):
    check_backward(data, [BACKWARD_CASES[0], BACKWARD_CASES[3]])


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_moe_topk_gate_backward_slow(data):
    check_backward(data, BACKWARD_CASES + BACKWARD_FULL_CASES)


# --- get_fused_mapping ------------------------------------------------------------------------------------------------

# (E, K): the default run's two kernel pairs; the slow run every documented K and a few E.
MAPPING_DEFAULT = [(72, 6), (256, 8)]
MAPPING_ALL = MAPPING_DEFAULT + [(16, 1), (256, 2), (384, 6), (33, 16), (64, 32), (1, 8)]
MAPPING_ALIGNMENTS = [1, 16, 64, 128]


def check_mapping(data, sizes):
    E, K = data.draw(st.sampled_from(sizes), label="(E, K)")
    T = data.draw(token_counts(), label="tokens")
    alignment = data.draw(st.one_of(st.sampled_from(MAPPING_ALIGNMENTS), st.integers(1, 300)), label="alignment")
    g = torch.Generator().manual_seed(data.draw(seeds(), label="seed"))
    # Ids from a few experts (crowded ranges, repeats within a token) or all of them, some slots unused.
    used = data.draw(st.integers(1, E), label="experts used")
    topk_idx = torch.randint(0, used, (T, K), generator=g)
    topk_idx[torch.rand(T, K, generator=g) < data.draw(st.sampled_from([0.0, 0.1, 0.9]), label="unused")] = -1
    bound = sum(-(-int((topk_idx == e).sum()) // alignment) * alignment for e in range(E))
    rows = data.draw(st.sampled_from([0, bound, bound + 7]), label="num_expanded_tokens")
    flavor = data.draw(st.sampled_from(["ascend", "cuda"]), label="flavor")
    outputs = get_fused_mapping(topk_idx, E, rows, alignment, target="cpu", flavor=flavor)
    expected = reference_mapping(topk_idx, E, outputs[0].shape[0], alignment)
    for i, (actual, wanted) in enumerate(zip(outputs, expected, strict=False)):
        assert_bitwise_equal(actual, wanted, f"E={E} K={K} T={T} A={alignment} N={rows} output {i}")


@given(st.data())
def test_get_fused_mapping(data):
    check_mapping(data, MAPPING_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_get_fused_mapping_slow(data):
    check_mapping(data, MAPPING_ALL)


# --- topk_sum_and_topk_group_idx -------------------------------------------------------------------------------------

# (G, P, num_topk_sum, num_topk_groups): the default run's two kernels; the slow run every documented value.
GROUPS_DEFAULT = [(8, 32, 2, 4), (4, 18, 1, 2)]
GROUPS_ALL = GROUPS_DEFAULT + [(1, 8, 1, 1), (1, 2, 2, 1), (16, 16, 2, 8), (32, 8, 2, 8), (32, 2, 1, 1), (16, 4, 2, 2),
                               (8, 9, 1, 8), (12, 6, 2, 4)]


def check_groups(data, cases):
    G, P, S, KG = data.draw(st.sampled_from(cases), label="(G, P, S, K)")
    T = data.draw(token_counts(), label="tokens")
    g = torch.Generator().manual_seed(data.draw(seeds(), label="seed"))
    scale = data.draw(st.sampled_from([1.0, 1e-30, 1e30]), label="scale")
    x = torch.randn(T, G, P, generator=g) * scale
    if data.draw(st.booleans(), label="ties"):
        x = x.round()
    x = sprinkle(data, x, FINITE_SPECIALS + [-float("inf")]).contiguous()
    flavor = data.draw(st.sampled_from(["ascend", "cuda"]), label="flavor")
    assert_bitwise_equal(topk_sum_and_topk_group_idx(x, S, KG, target="cpu", flavor=flavor),
                         reference_groups(x, S, KG), f"G={G} P={P} S={S} K={KG} T={T}")


@given(st.data())
def test_topk_sum_and_topk_group_idx(data):
    check_groups(data, GROUPS_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_topk_sum_and_topk_group_idx_slow(data):
    check_groups(data, GROUPS_ALL)


# --- group_count and aux_fi -----------------------------------------------------------------------------------------

# (E, K): the default run's kernels; the slow run every documented K.
COUNTS_DEFAULT = [(72, 6)]
COUNTS_ALL = COUNTS_DEFAULT + [(16, 1), (256, 2), (200, 8), (5, 16), (64, 32), (1, 8), (384, 6)]


def check_counts(data, sizes):
    E, K = data.draw(st.sampled_from(sizes), label="(E, K)")
    T = data.draw(token_counts(), label="tokens")
    g = torch.Generator().manual_seed(data.draw(seeds(), label="seed"))
    used = data.draw(st.integers(1, E), label="ids used")
    idx = torch.randint(0, used, (T, K), generator=g)
    idx[torch.rand(T, K, generator=g) < data.draw(st.sampled_from([0.0, 0.1, 0.9, 1.0]), label="unused")] = -1
    num_aux_topk = data.draw(st.one_of(st.sampled_from([1, K]), st.integers(1, 2**31 - 1)), label="num_aux_topk")
    flavor = data.draw(st.sampled_from(["ascend", "cuda"]), label="flavor")
    what = f"E={E} K={K} T={T} k={num_aux_topk} {flavor}"
    assert_bitwise_equal(group_count(idx, E, target="cpu", flavor=flavor), reference_group_count(idx, E),
                         f"{what} counts")
    assert_bitwise_equal(aux_fi(idx, E, num_aux_topk, target="cpu", flavor=flavor),
                         reference_aux_fi(idx, E, num_aux_topk), f"{what} fi")


@given(st.data())
def test_group_count_and_aux_fi(data):
    check_counts(data, COUNTS_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_group_count_and_aux_fi_slow(data):
    check_counts(data, COUNTS_ALL)


# --- reduce_fused ---------------------------------------------------------------------------------------------------

REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}
REDUCE_DEFAULT = [(4, "fp32", ""), (4, "bf16", ""), (4, "e4m3", "")]  # test_reduce_fused's cpu kernels
REDUCE_FORMATS = [("fp32", ""), ("bf16", ""), ("e4m3", ""), ("fp32", "e4m3"), ("bf16", "e4m3")]
REDUCE_ALL = ([(k, *REDUCE_FORMATS[i % len(REDUCE_FORMATS)]) for i, k in enumerate((1, 2, 4, 6, 8, 9, 16, 32))]
              + [(4, fmt, fp8) for fmt, fp8 in REDUCE_FORMATS])


def check_reduce_fused(data, cases):
    K, fmt, fp8 = data.draw(st.sampled_from(cases), label="(K, dtype, fp8_format)")
    flavor = data.draw(st.sampled_from(["ascend", "cuda"]), label="flavor")
    T = data.draw(token_counts(limit=100), label="tokens")
    H = data.draw(st.one_of(st.sampled_from([0, 1, 64, 512, 513]), st.integers(1, 600)), label="hidden")
    N = T * K + data.draw(st.integers(0, 5), label="spare rows")
    seed = data.draw(seeds(), label="seed")
    g = torch.Generator().manual_seed(seed)
    scale = data.draw(st.sampled_from([1.0, 1e-30, 1e30, 2.0**-140, 64.0]), label="scale")
    # Non-finite rows propagate (no check): NaNs compare by position.
    rows = sprinkle(data, torch.randn(N, H, generator=g) * scale, FINITE_SPECIALS + NONFINITE).to(REDUCE_DTYPES[fmt])
    with_x_sf = fmt == "e4m3" or data.draw(st.booleans(), label="with_x_sf")
    x_sf = sprinkle(data, torch.rand(N, generator=g) * 4, FINITE_SPECIALS) if with_x_sf else None
    weights = (sprinkle(data, torch.randn(T, K, generator=g), FINITE_SPECIALS)
               if data.draw(st.booleans(), label="with_weights") else None)
    pos = placement(T, K, N, seed + 1, unused=data.draw(st.sampled_from([0.0, 0.25, 1.0]), label="unused"))
    if K > 1 and data.draw(st.booleans(), label="a row in two slots"):
        pos[:, -1] = pos[:, 0]
    sf = (torch.tensor([data.draw(st.sampled_from([1.0, 0.5, -3.0, 1e-3, 1e3, 2.0**20]), label="sf")])
          if fp8 and data.draw(st.booleans(), label="with_sf") else None)
    x = rows if x_sf is None else (rows, x_sf)
    if T and data.draw(st.integers(0, 7).map(lambda v: v == 0), label="bad position"):
        pos[data.draw(st.integers(0, T - 1), label="bad token"), data.draw(st.integers(0, K - 1), label="bad slot")] = \
            data.draw(st.sampled_from([-2, N, 2**31 - 1, -(2**31)]), label="bad value")
        with pytest.raises(ValueError, match="token_topk_to_pos holds positions outside"):
            reduce_fused(x, weights, pos, fp8, sf, target="cpu", flavor=flavor)
        return
    out = reduce_fused(x, weights, pos, fp8, sf, target="cpu", flavor=flavor)
    assert_bitwise_equal(out, reference_reduce_fused(x, weights, pos, fp8, sf),
                         f"K={K} {fmt}->{fp8 or fmt} T={T} H={H} {flavor}", any_nan=True)


@given(st.data())
def test_reduce_fused(data):
    check_reduce_fused(data, REDUCE_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_reduce_fused_slow(data):
    check_reduce_fused(data, REDUCE_ALL)


# --- mask_indices_by_tp ----------------------------------------------------------------------------------------------

# (K, dtype): the default run's two kernels; the slow run every documented K in both dtypes.
MASK_DEFAULT = [(8, torch.int64), (3, torch.int32)]
MASK_ALL = MASK_DEFAULT + [(k, dtype) for k in (1, 2, 6, 8, 16, 32) for dtype in (torch.int64, torch.int32)]
MASK_DTYPE_NAMES = {torch.int64: "int64", torch.int32: "int32"}


def check_mask(data, sizes):
    K, dtype = data.draw(st.sampled_from(sizes), label="(K, dtype)")
    T = data.draw(token_counts(), label="tokens")
    num_ep_ranks = data.draw(st.one_of(st.sampled_from([1, 2, 8, 64]), st.integers(1, 2**31 - 1)), label="ep ranks")
    n = data.draw(st.one_of(st.integers(num_ep_ranks, min(4 * num_ep_ranks, 2**31 - 1)),
                            st.integers(num_ep_ranks, 2**31 - 1)), label="n")
    num_tp_ranks = data.draw(st.one_of(st.sampled_from([1, 2, 4, 8]), st.integers(1, 2**31 - 1)), label="tp ranks")
    tp_rank = data.draw(st.integers(0, num_tp_ranks - 1), label="tp rank")
    g = torch.Generator().manual_seed(data.draw(seeds(), label="seed"))
    # Ids near the rank's blocks or over the whole 32-bit range, some negative down to the dtype's minimum.
    top = data.draw(st.sampled_from([n, min(2 * n, 2**31 - 1), 2**31 - 1]), label="largest id")
    ids = torch.randint(-3, top + 1, (T, K), generator=g)
    ids[torch.rand(T, K, generator=g) < 0.02] = -(2**63) if dtype == torch.int64 else -(2**31)
    ids = ids.to(dtype)
    flavor = data.draw(st.sampled_from(["ascend", "cuda"]), label="flavor")
    ranks = (n, num_ep_ranks, tp_rank, num_tp_ranks)
    if dtype == torch.int64 and T and data.draw(st.integers(0, 7).map(lambda v: v == 0), label="id above 2^31 - 1"):
        ids.view(-1)[data.draw(st.integers(0, T * K - 1), label="where")] = data.draw(
            st.integers(2**31, 2**63 - 1), label="large id")
        with pytest.raises(ValueError, match=r"indices holds ids above 2\^31 - 1"):
            mask_indices_by_tp(ids, *ranks, target="cpu", flavor=flavor)
        return
    assert_bitwise_equal(mask_indices_by_tp(ids, *ranks, target="cpu", flavor=flavor), reference_mask(ids, *ranks),
                         f"K={K} {dtype} T={T} ranks={ranks}")


@given(st.data())
def test_mask_indices_by_tp(data):
    check_mask(data, MASK_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_mask_indices_by_tp_slow(data):
    check_mask(data, MASK_ALL)


# --- inplace_unique_group_indices ----------------------------------------------------------------------------------

UNIQUE_DEFAULT = [6]
UNIQUE_ALL = UNIQUE_DEFAULT + [1, 2, 4, 8, 16, 32]


def check_unique(data, topks):
    K = data.draw(st.sampled_from(topks), label="K")
    T = data.draw(token_counts(), label="tokens")
    num_groups = data.draw(st.one_of(st.sampled_from([1, 2, 8, 128]), st.integers(1, 2**31 - 1)), label="groups")
    g = torch.Generator().manual_seed(data.draw(seeds(), label="seed"))
    # Ids from a few groups (many repeats) or spread, some unused; offset towards the top of the range.
    used = data.draw(st.integers(1, min(num_groups, 64)), label="groups used")
    ids = torch.randint(0, used, (T, K), generator=g) + data.draw(st.integers(0, num_groups - used), label="offset")
    ids[torch.rand(T, K, generator=g) < data.draw(st.sampled_from([0.0, 0.1, 0.9]), label="unused")] = -1
    flavor = data.draw(st.sampled_from(["ascend", "cuda"]), label="flavor")
    result = ids.clone()
    if T and data.draw(st.integers(0, 7).map(lambda v: v == 0), label="bad id"):
        result.view(-1)[data.draw(st.integers(0, T * K - 1), label="where")] = data.draw(
            st.one_of(st.integers(-(2**63), -2), st.integers(num_groups, 2**63 - 1)), label="bad value")
        before = result.clone()
        with pytest.raises(ValueError, match="group_indices holds group ids outside"):
            inplace_unique_group_indices(result, num_groups, target="cpu", flavor=flavor)
        assert_bitwise_equal(result, before, "group_indices after the error")
        return
    inplace_unique_group_indices(result, num_groups, target="cpu", flavor=flavor)
    assert_bitwise_equal(result, reference_unique(ids, num_groups), f"K={K} T={T} G={num_groups}")


@given(st.data())
def test_inplace_unique_group_indices(data):
    check_unique(data, UNIQUE_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_inplace_unique_group_indices_slow(data):
    check_unique(data, UNIQUE_ALL)


# --- expand_to_fused, expand_to_fused_with_sf ---------------------------------------------------------------------

EXPAND_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "e4m3": torch.float8_e4m3fn,
                 "e5m2": torch.float8_e5m2}
EXPAND_TOPK_ALL = [1, 2, 4, 6, 8, 16, 32]
# (num_per_channels, SF word, column-major in, column-major out)
EXPAND_SF_DEFAULT = [(128, "fp32", False, False), (32, "ue8m0", True, True)]
EXPAND_SF_ALL = [(npc, sf, cin, cout) for npc in (16, 32, 64, 128) for sf in ("fp32", "ue8m0", "ue8m0_int16")
                 for cin in (False, True) for cout in (False, True)]
EXPAND_SF_WORDS = {"fp32": (torch.float32, 1), "ue8m0": (torch.int32, 4), "ue8m0_int16": (torch.int16, 2)}


def random_bits(shape, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Any bit patterns (NaN payloads, -0.0, subnormals): the copy must keep them all."""
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[dtype.itemsize]
    info = torch.iinfo(bits)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(bits).view(dtype)


def fused_layout(data, topks):
    """``(token_topk_to_pos, pos_to_expert, K, g)`` of a drawn routing (unused slots and repeated experts
    included) laid out by the reference ``get_fused_mapping`` with drawn trailing padding; rarely
    corrupted: then also the ``ValueError`` match."""
    k = data.draw(st.sampled_from(topks), label="K")
    num_tokens = data.draw(token_counts(limit=200), label="tokens")
    num_experts = data.draw(st.integers(1, 40), label="experts")
    alignment = data.draw(st.sampled_from([1, 4, 16, 64]), label="alignment")
    g = torch.Generator().manual_seed(data.draw(seeds(), label="seed"))
    idx = torch.randint(-1, num_experts, (num_tokens, k), generator=g)
    counts = torch.bincount(idx[idx >= 0], minlength=num_experts)
    needed = int(((counts + alignment - 1) // alignment).sum()) * alignment
    extra = data.draw(st.integers(0, 40), label="extra rows")
    pte, _, _, pos, *_ = reference_mapping(idx, num_experts, needed + extra, alignment)
    pos, pte = pos.contiguous(), pte.contiguous()
    bad = None
    if pos.numel() and data.draw(st.integers(0, 7), label="corrupt") == 0:
        pos = pos.clone()
        slot = data.draw(st.integers(0, pos.numel() - 1), label="bad slot")
        kind = data.draw(st.sampled_from(["outside", "padding", "unused"]), label="corruption")
        if kind == "outside":
            pos.view(-1)[slot] = data.draw(st.sampled_from([-2, pte.shape[0], 2**31 - 1]), label="bad position")
            bad = "holds positions outside"
        elif kind == "padding" and bool((pte < 0).any()):
            pos.view(-1)[slot] = int(torch.nonzero(pte < 0)[0])
            bad = "places slots on padding rows"
        elif kind == "unused" and bool((pos >= 0).any()):
            pos.view(-1)[int(torch.nonzero(pos.view(-1) >= 0)[0])] = -1
            bad = "a different number of slots"
    return pos, pte, bad, g


def hidden_sizes(data, any_width: bool) -> int:
    """Row widths: any (1-, 2- and 4-byte words) in the slow twins, even ones of whole 4-byte words by default
    (the one kernel per K that both ops share)."""
    if any_width:
        return data.draw(st.one_of(st.sampled_from([0, 1, 37, 512, 1100]), st.integers(0, 700)), label="H")
    return 4 * data.draw(st.one_of(st.sampled_from([0, 16, 128, 275]), st.integers(0, 200)), label="H / 4")


def check_expand_to_fused(data, topks, any_width: bool):
    pos, pte, bad, g = fused_layout(data, topks)
    dtype = EXPAND_DTYPES[data.draw(st.sampled_from(list(EXPAND_DTYPES)), label="dtype")]
    x = random_bits((pos.shape[0], hidden_sizes(data, any_width)), dtype, g)
    flavor = data.draw(st.sampled_from(["ascend", "cuda"]), label="flavor")
    if bad is not None:
        with pytest.raises(ValueError, match=bad):
            expand_to_fused(x, pos, pte, target="cpu", flavor=flavor)
        return
    out = expand_to_fused(x, pos, pte, target="cpu", flavor=flavor)
    assert_bitwise_equal(out, reference_expand(x, pos, pte), f"K={pos.shape[1]} T={x.shape[0]} H={x.shape[1]} {dtype}")


def check_expand_to_fused_with_sf(data, topks, sf_cases, any_width: bool):
    pos, pte, bad, g = fused_layout(data, topks)
    npc, sf_name, col_in, col_out = data.draw(st.sampled_from(sf_cases), label="(npc, sf, col in, col out)")
    num_tokens, hidden = pos.shape[0], hidden_sizes(data, any_width)
    word, pack = EXPAND_SF_WORDS[sf_name]
    sf = random_bits((num_tokens, ((hidden + npc - 1) // npc + pack - 1) // pack), word, g)
    if col_in:
        sf = sf.t().contiguous().t()
    x = (random_bits((num_tokens, hidden), torch.float8_e4m3fn, g), sf)
    flavor = data.draw(st.sampled_from(["ascend", "cuda"]), label="flavor")
    if bad is not None:
        with pytest.raises(ValueError, match=bad):
            expand_to_fused_with_sf(x, npc, pos, pte, col_out, target="cpu", flavor=flavor)
        return
    out, out_sf = expand_to_fused_with_sf(x, npc, pos, pte, col_out, target="cpu", flavor=flavor)
    ref, ref_sf = expand_to_fused_with_sf(x, npc, pos, pte, col_out, target="torch", flavor=flavor)
    what = f"K={pos.shape[1]} T={num_tokens} H={hidden} npc={npc} {sf_name} col={col_in}/{col_out} {flavor}"
    assert_bitwise_equal(out, ref, f"{what} data")
    assert_bitwise_equal(out_sf, ref_sf, f"{what} sf")
    if col_out and out_sf.numel():
        # The alignment rows of the buffer: zero.
        buffer = torch.as_strided(out_sf, (out_sf.shape[1], out_sf.stride(1)), (out_sf.stride(1), 1))
        assert bool((buffer[:, out_sf.shape[0]:].contiguous().view(torch.uint8) == 0).all()), f"{what} alignment rows"


@given(st.data())
def test_expand_to_fused(data):
    check_expand_to_fused(data, [8], any_width=False)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_expand_to_fused_slow(data):
    check_expand_to_fused(data, EXPAND_TOPK_ALL, any_width=True)


@given(st.data())
def test_expand_to_fused_with_sf(data):
    check_expand_to_fused_with_sf(data, [8], EXPAND_SF_DEFAULT, any_width=False)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_expand_to_fused_with_sf_slow(data):
    check_expand_to_fused_with_sf(data, EXPAND_TOPK_ALL, EXPAND_SF_ALL, any_width=True)


# --- top2_sum_gate -------------------------------------------------------------------------------------------------

# (scoring, E, K, G, KG, S, mask, fixed, mapping, num_tp_ranks, flavor): the default run's two kernels; the slow run
# every documented option value (groups off as 0/0 and as G = KG, on; shared experts always with a map).
TOP2_DEFAULT = [("sigmoid", 256, 8, 8, 4, 2, True, True, True, 2, "ascend"),
                ("softmax", 72, 6, 0, 0, 0, False, False, False, 1, "cuda")]
TOP2_ALL = TOP2_DEFAULT + [
    ("sqrtsoftplus", 72, 6, 4, 2, 1, True, False, True, 4, "cuda"),
    ("sqrtsoftplus", 64, 32, 16, 8, 0, False, True, False, 1, "ascend"),
    ("softmax", 64, 16, 8, 4, 2, True, True, True, 2, "ascend"),
    ("sigmoid", 32, 1, 16, 1, 1, False, False, True, 1, "cuda"),
    ("sigmoid", 48, 2, 8, 8, 2, True, False, True, 4, "ascend"),
    ("sqrtsoftplus", 40, 4, 0, 0, 0, True, True, False, 2, "ascend"),
]


def check_top2(data, cases):
    scoring, E, K, G, KG, S, mask, fixed, mapping, ntp, flavor = data.draw(st.sampled_from(cases), label="case")
    T = data.draw(token_counts(), label="tokens")
    g = torch.Generator().manual_seed(data.draw(seeds(), label="seed"))
    logits = torch.randn(T, E, generator=g) * data.draw(st.sampled_from([1.0, 1e-3, 30.0]), label="scale")
    if data.draw(st.booleans(), label="ties"):
        logits = logits.round()
    nonfinite = data.draw(st.integers(0, 7), label="non-finite") == 0
    logits = sprinkle(data, logits, FINITE_SPECIALS + (NONFINITE if nonfinite else [])).contiguous()
    bias = torch.randn(E, generator=g)
    if data.draw(st.booleans(), label="integer bias"):
        bias = bias.round()
    args = {"mask": torch.rand(T, generator=g) > 0.2 if mask else None}
    if fixed:
        args["fix_routing_mask"] = torch.rand(T, generator=g) < 0.5
        args["unmapped_topk_idx"] = torch.randint(0, E, (T, K), generator=g)
    else:
        args["unmapped_topk_idx"] = torch.full((T, K), -3, dtype=torch.int64)
    dup = 1
    if mapping:
        dup = data.draw(st.integers(S + 1, 4), label="Dup")
        args["to_physical_map"], args["logical_count"] = demo_map(E + S, dup, E + dup - 1, int(g.initial_seed()) + 1)
    nep = data.draw(st.integers(1, E + dup - 1), label="num_ep_ranks")
    ranks = (data.draw(st.integers(0, nep - 1), label="ep_rank"), nep, data.draw(st.integers(0, ntp - 1)), ntp)
    head = (logits, bias, K, KG, G, S > 0, S, 1.5, *ranks, scoring)
    expected_unmapped = args["unmapped_topk_idx"].clone()
    try:
        ref = reference_top2(*head, **{**args, "unmapped_topk_idx": expected_unmapped}, flavor=flavor)
    except ValueError:
        ref = None
    unmapped = args["unmapped_topk_idx"].clone()
    what = f"{scoring} E={E} K={K} G={G}/{KG} S={S} T={T} ranks={ranks} flavor={flavor}"
    if ref is None:
        with pytest.raises(ValueError):
            top2_sum_gate(*head, **{**args, "unmapped_topk_idx": unmapped}, target="cpu", flavor=flavor)
        assert_bitwise_equal(unmapped, args["unmapped_topk_idx"], f"{what}: unmapped_topk_idx after the error")
        return
    idx, weights = top2_sum_gate(*head, **{**args, "unmapped_topk_idx": unmapped}, target="cpu", flavor=flavor)
    assert_bitwise_equal(idx, ref[0], f"{what} topk_idx")
    assert_bitwise_equal(weights, ref[1], f"{what} topk_weights")
    assert_bitwise_equal(unmapped, ref[2], f"{what} unmapped_topk_idx")


@few_settings()
@given(st.data())
def test_top2_sum_gate(data):
    check_top2(data, TOP2_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_top2_sum_gate_slow(data):
    check_top2(data, TOP2_ALL)


# --- what the slow twins draw ---------------------------------------------------------------------------------------

# Per op, the values of each option ``vmi run OP -o name=value`` documents that the slow twins draw
# (from the case tables they sample); a documented value no twin draws fails the test below.
DRAWN = {
    "topk_gate": drawn_values(TOPK_ALL, num_topk=lambda c: c[1]),
    "normalize_weight": {"num_topk": NORMALIZE_TOPK_ALL},
    "moe_topk_gate_forward": drawn_values(GATE_ALL, num_topk=lambda c: c.K, num_shared_experts=lambda c: c.S,
                                          bias=lambda c: c.bias, mask=lambda c: c.mask),
    "moe_topk_gate_backward": drawn_values(BACKWARD_CASES + BACKWARD_FULL_CASES, num_topk=lambda c: c.K),
    "get_fused_mapping": {"num_topk": {k for _, k in MAPPING_ALL}, "alignment": MAPPING_ALIGNMENTS},
    "reduce_fused": {**drawn_values(REDUCE_ALL, num_topk=lambda c: c[0], dtype=lambda c: c[1],
                                    fp8_format=lambda c: c[2]),
                     "with_weights": {False, True}, "with_x_sf": {False, True}, "with_sf": {False, True}},
    "mask_indices_by_tp": {"num_topk": {k for k, _ in MASK_ALL}, "dtype": {MASK_DTYPE_NAMES[d] for _, d in MASK_ALL}},
    "inplace_unique_group_indices": {"num_topk": set(UNIQUE_ALL)},
    "expand_to_fused": {"num_topk": EXPAND_TOPK_ALL, "dtype": list(EXPAND_DTYPES)},
    "expand_to_fused_with_sf": {
        "num_topk": EXPAND_TOPK_ALL,
        **drawn_values(EXPAND_SF_ALL, num_per_channels=lambda c: c[0], sf=lambda c: c[1].partition("_int16")[0],
                       use_tma_aligned_col_major_sf=lambda c: c[3]),
    },
    "top2_sum_gate": drawn_values(TOP2_ALL, scoring_func=lambda c: c[0], num_topk=lambda c: c[2],
                                  num_groups=lambda c: c[3], num_topk_groups=lambda c: c[4],
                                  num_shared_experts=lambda c: c[5], mask=lambda c: c[6], fixed=lambda c: c[7],
                                  mapping=lambda c: c[8], num_tp_ranks=lambda c: c[9]),
    "group_count": {"num_topk": {k for _, k in COUNTS_ALL}},
    "aux_fi": {"num_topk": {k for _, k in COUNTS_ALL}},
    "topk_sum_and_topk_group_idx": drawn_values(GROUPS_ALL, num_groups=lambda c: c[0], num_topk_sum=lambda c: c[2],
                                                num_topk_groups=lambda c: c[3]),
}


def test_the_slow_twins_draw_every_documented_option_value():
    assert_every_option_value_drawn(DRAWN)
