"""The gate forward reference: selection, weights, token classes, replica mapping, force-random routing."""

import itertools

import pytest
import torch

from vmi_core.formats import f32_bits
from vmi_core.stochastic import sr_hash
from vmi_core.tools.testing import assert_bitwise_equal
from vmi_moe.reference import force_random_route, moe_topk_gate_forward, resolve_collisions
from vmi_moe.reference.gate import RANDOM_TAG
from vmi_moe.softplus import sqrt_softplus

FLAVORS = ("ascend", "cuda")
G0 = 0.8325546383857727  # fp32(sqrt(ln 2)): the correctly rounded sqrt(softplus(0))


def f32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


def i64(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64)


def gate(logits: torch.Tensor, k: int, **kwargs):
    """The reference with no shared experts, scale 1.5 and EP rank 0 unless overridden."""
    options = {"use_shared_as_routed": False, "num_shared_experts": 0, "routed_scaling_factor": 1.5, "ep_rank": 0}
    options.update(kwargs)
    return moe_topk_gate_forward(logits, k, options.pop("use_shared_as_routed"), options.pop("num_shared_experts"),
                                 options.pop("routed_scaling_factor"), options.pop("ep_rank"), **options)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_worked_example_bias_changes_choice_not_weight(flavor: str) -> None:
    u = torch.tensor([[1.0, 0.5, 0.5, 0.2]])
    bias = torch.tensor([0.0, 0.5, 0.5, 0.0])
    idx, weights, unmapped, scores = gate(torch.zeros(1, 4), 2, bias=bias, unbiased_scores=u, flavor=flavor)
    assert_bitwise_equal(idx, i64([[0, 1]]))
    assert_bitwise_equal(unmapped, i64([[0, 1]]))
    assert int(f32_bits(f32(1.0) / f32(1.5))) == int(f32_bits(f32(0.6666667)))
    assert_bitwise_equal(weights, torch.tensor([[1.0, 0.5]]))
    assert_bitwise_equal(scores, u)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_zero_logits_pick_the_first_experts(flavor: str) -> None:
    idx, weights, unmapped, scores = gate(torch.zeros(5, 72), 6, flavor=flavor)
    first = torch.arange(6).expand(5, 6).contiguous()
    assert_bitwise_equal(unmapped, first)
    assert_bitwise_equal(idx, first)
    assert_bitwise_equal(scores, sqrt_softplus(torch.zeros(5, 72), flavor))
    if flavor == "ascend":
        assert_bitwise_equal(scores, torch.full((5, 72), G0))
    assert torch.unique(weights).numel() == 1
    assert abs(weights[0, 0].item() - 1.5 / 6) < 1e-7


@pytest.mark.parametrize("flavor", FLAVORS)
def test_weights_are_divide_then_scale(flavor: str) -> None:
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(8, 16, generator=g)
    bias = torch.randn(16, generator=g)
    idx, weights, unmapped, scores = gate(logits, 3, bias=bias, routed_scaling_factor=2.5, flavor=flavor)
    keys = scores + bias
    for t in range(8):
        ranked = sorted(range(16), key=lambda e, t=t: (-keys[t, e].item(), e))[:3]
        assert unmapped[t].tolist() == ranked
        v = [scores[t, e] for e in ranked]
        # With K = 3 both flavors add (v0 + v1) + v2: the butterfly pairs lanes 0/2, then 0/1.
        denom = ((v[0] + v[2]) + v[1] if flavor == "cuda" else (v[0] + v[1]) + v[2]) + f32(1e-20)
        assert_bitwise_equal(weights[t], torch.stack([(x / denom) * f32(2.5) for x in v]), f"row {t}")


def test_image_bias_replaces_bias_for_image_tokens() -> None:
    logits = torch.zeros(3, 4)
    bias = torch.tensor([0.0, 1.0, 0.0, 0.0])
    image_bias = torch.tensor([0.0, 0.0, 2.0, 0.0])
    image = torch.tensor([False, True, False])
    _, _, unmapped, _ = gate(logits, 1, bias=bias, image_bias=image_bias, image_token_mask=image)
    assert_bitwise_equal(unmapped, i64([[1], [2], [1]]))
    _, _, unmapped, _ = gate(logits, 1, image_bias=image_bias, image_token_mask=image)
    assert_bitwise_equal(unmapped, i64([[0], [2], [0]]))


def test_masked_rows() -> None:
    logits = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    logits[1] = float("nan")
    logits[3, 0] = float("inf")
    mask = torch.tensor([True, False, True, False])
    to_physical_map = torch.arange(10 * 2, dtype=torch.int32).reshape(10, 2)
    logical_count = torch.full((10,), 2, dtype=torch.int32)
    idx, weights, unmapped, scores = gate(logits, 3, use_shared_as_routed=True, num_shared_experts=2, mask=mask,
                                          to_physical_map=to_physical_map, logical_count=logical_count,
                                          force_random=torch.tensor([False, True, False, True]))
    for t in (1, 3):
        assert_bitwise_equal(idx[t], torch.full((5,), -1))
        assert_bitwise_equal(weights[t], torch.zeros(5))
        assert_bitwise_equal(unmapped[t], torch.full((3,), -1))
        assert_bitwise_equal(scores[t], torch.zeros(8))
    assert bool((idx[[0, 2]] >= 0).all())


def test_all_tokens_masked() -> None:
    idx, weights, unmapped, scores = gate(torch.full((3, 8), float("nan")), 2, mask=torch.zeros(3, dtype=torch.bool))
    assert_bitwise_equal(idx, torch.full((3, 2), -1))
    assert_bitwise_equal(weights, torch.zeros(3, 2))
    assert_bitwise_equal(unmapped, torch.full((3, 2), -1))
    assert_bitwise_equal(scores, torch.zeros(3, 8))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_fixed_routing_keeps_duplicates(flavor: str) -> None:
    u = torch.tensor([[0.25, 0.75, 1.5, 3.0], [0.25, 0.75, 1.5, 3.0], [0.25, 0.75, 1.5, 3.0]])
    given = i64([[1, 1], [3, 0], [0, 0]])
    fixed = torch.tensor([True, True, False])
    idx, weights, unmapped, _ = gate(torch.zeros(3, 4), 2, fix_routing_mask=fixed, unmapped_topk_idx=given,
                                     unbiased_scores=u, flavor=flavor)
    assert_bitwise_equal(unmapped, i64([[1, 1], [3, 0], [3, 2]]))
    assert_bitwise_equal(idx, unmapped)
    s = f32(1.5)
    for t, (a, b) in enumerate(unmapped.tolist()):
        denom = (u[t, a] + u[t, b]) + f32(1e-20)
        assert_bitwise_equal(weights[t], torch.stack([(u[t, a] / denom) * s, (u[t, b] / denom) * s]), f"row {t}")
    assert_bitwise_equal(weights[0], torch.tensor([0.75, 0.75]))
    assert_bitwise_equal(given, i64([[1, 1], [3, 0], [0, 0]]), "input left unchanged")


@pytest.mark.parametrize("num_shared", [1, 2])
def test_shared_slots(num_shared: int) -> None:
    idx, weights, unmapped, _ = gate(torch.zeros(2, 8), 3, use_shared_as_routed=True, num_shared_experts=num_shared)
    shared = list(range(8, 8 + num_shared))
    assert_bitwise_equal(idx, i64([[0, 1, 2, *shared]] * 2))
    assert_bitwise_equal(weights[:, 3:].contiguous(), torch.ones(2, num_shared))
    assert tuple(unmapped.shape) == (2, 3)


def test_shared_experts_ignored_without_use_shared_as_routed() -> None:
    idx, weights, _, _ = gate(torch.zeros(2, 8), 3, use_shared_as_routed=False, num_shared_experts=2)
    assert tuple(idx.shape) == (2, 3) and tuple(weights.shape) == (2, 3)


# map[l, d] = 10 * l + d; replica counts per logical expert (E = 4 routed + 1 shared).
MAP = torch.tensor([[10 * l + d for d in range(3)] for l in range(5)], dtype=torch.int32)
COUNT = torch.tensor([3, 2, 1, 3, 2], dtype=torch.int32)


@pytest.mark.parametrize(("ep_rank", "expected"), [
    # dup = (ep_rank + 23333 t) mod count: tickets 5, 23338, 46671 -> mod 3: 2, 1, 0; mod 2: 1, 0, 1.
    (5, [[2, 11, 20, 41], [1, 10, 20, 40], [0, 11, 20, 41]]),
    # tickets -1, 23332, 46665 -> mod 3: 2, 1, 0; mod 2: 1, 0, 1 (a floor modulo, never negative).
    (-1, [[2, 11, 20, 41], [1, 10, 20, 40], [0, 11, 20, 41]]),
    # tickets 0, 23333, 46666 -> mod 3: 0, 2, 1; mod 2: 0, 1, 0.
    (0, [[0, 10, 20, 40], [2, 11, 20, 41], [1, 10, 20, 40]]),
])
def test_replica_mapping(ep_rank: int, expected: list[list[int]]) -> None:
    given = i64([[0, 1, 2]] * 3)
    idx, _, unmapped, _ = gate(torch.zeros(3, 4), 3, use_shared_as_routed=True, num_shared_experts=1,
                               ep_rank=ep_rank, fix_routing_mask=torch.ones(3, dtype=torch.bool),
                               unmapped_topk_idx=given, to_physical_map=MAP, logical_count=COUNT)
    assert_bitwise_equal(idx, i64(expected))
    assert_bitwise_equal(unmapped, given)


def test_replica_mapping_past_int32_overflow() -> None:
    num_tokens = 92040
    to_physical_map = torch.tensor([[100, 101, 102], [1, 1, 1], [2, 2, 2], [3, 3, 3]], dtype=torch.int32)
    logical_count = torch.tensor([3, 1, 1, 1], dtype=torch.int32)
    idx, _, _, _ = gate(torch.zeros(num_tokens, 4), 1, ep_rank=7,
                        to_physical_map=to_physical_map, logical_count=logical_count)
    # 92037 * 23333 + 7 > 2**31 - 1: the int64 ticket does not wrap.
    expected = [100 + (7 + t * 23333) % 3 for t in range(92030, num_tokens)]
    assert idx[92030:, 0].tolist() == expected


def test_collision_removal_worked_example() -> None:
    assert_bitwise_equal(resolve_collisions(i64([[3, 0, 3, 1]]), 6), i64([[3, 0, 5, 2]]))


@pytest.mark.parametrize(("num_experts", "num_lanes"), [(6, 3), (5, 5), (7, 1)])
def test_collision_removal_is_a_bijection(num_experts: int, num_lanes: int) -> None:
    draws = i64(list(itertools.product(*[range(num_experts - l) for l in range(num_lanes)])))
    out = resolve_collisions(draws, num_experts)
    assert bool(((out >= 0) & (out < num_experts)).all())
    assert all(len(set(row)) == num_lanes for row in out.tolist())
    # Every ordered choice of distinct experts comes from exactly one draw vector: uniform draws give uniform routes.
    assert len(set(map(tuple, out.tolist()))) == len(draws)


def test_collision_removal_rejects_draws_out_of_range() -> None:
    with pytest.raises(ValueError, match="draws"):
        resolve_collisions(i64([[0, 5]]), 6)


def test_force_random_route() -> None:
    num_tokens, lanes, num_experts = 4000, 4, 16
    idx, weights = force_random_route(num_tokens, lanes, num_experts, ep_rank=3)
    assert idx.dtype == torch.int64 and weights.dtype == torch.float32
    assert bool(((idx >= 0) & (idx < num_experts)).all())
    assert bool((idx.sort(dim=1).values.diff(dim=1) > 0).all())
    assert bool(((weights > 0) & (weights <= 1)).all())
    assert bool(((weights * 2**24).frac() == 0).all())
    again_idx, again_weights = force_random_route(num_tokens, lanes, num_experts, ep_rank=3)
    assert_bitwise_equal(again_idx, idx)
    assert_bitwise_equal(again_weights, weights)
    other_idx, _ = force_random_route(num_tokens, lanes, num_experts, ep_rank=4)
    assert not torch.equal(other_idx, idx)
    # Chi-square of the expert ids against uniform, as TileKernels tests it.
    counts = torch.bincount(idx.flatten(), minlength=num_experts).double()
    expected = idx.numel() / num_experts
    assert ((counts - expected) ** 2 / expected).sum().item() < 4 * (num_experts - 1)


def test_force_random_weights_and_draws_from_the_hash() -> None:
    idx, weights = force_random_route(3, 2, 9, ep_rank=-2)
    r0, r1 = sr_hash(torch.tensor(2**32 - 2), torch.tensor(2), torch.tensor(1), torch.tensor(RANDOM_TAG),
                     torch.tensor(0))
    assert weights[2, 1].item() == ((int(r0) >> 8) + 1) / 2**24
    _, r1_lane0 = sr_hash(torch.tensor(2**32 - 2), torch.tensor(2), torch.tensor(0),
                            torch.tensor(RANDOM_TAG), torch.tensor(0))
    draws = i64([[int(r1_lane0) % 9, int(r1) % 8]])
    assert_bitwise_equal(idx[2:], resolve_collisions(draws, 9))


def test_force_random_rows_in_the_forward() -> None:
    logits = torch.randn(6, 8, generator=torch.Generator().manual_seed(5))
    logits[1] = float("nan")
    forced = torch.tensor([False, True, True, False, True, True])
    mask = torch.tensor([True, True, True, True, True, False])
    fixed = torch.tensor([False, False, True, True, False, False])
    given = i64([[7, 6]] * 6)
    idx, weights, unmapped, scores = gate(logits, 2, use_shared_as_routed=True, num_shared_experts=1, ep_rank=9,
                                          mask=mask, force_random=forced, fix_routing_mask=fixed,
                                          unmapped_topk_idx=given, to_physical_map=MAP.repeat(2, 1)[:9],
                                          logical_count=torch.ones(9, dtype=torch.int32))
    random_idx, random_weights = force_random_route(6, 3, 9, ep_rank=9)
    for t in (1, 2, 4):
        assert_bitwise_equal(idx[t], random_idx[t])
        assert_bitwise_equal(weights[t], random_weights[t])
        assert_bitwise_equal(unmapped[t], i64([-1, -1]))
        assert_bitwise_equal(scores[t], torch.zeros(8))
    assert unmapped[3].tolist() == [7, 6]
    # Logical 7, 6 and the shared expert 8 live in rows 2, 1 and 3 of MAP, replica 0.
    assert idx[3].tolist() == [20, 10, 30]
    assert_bitwise_equal(idx[5], torch.full((3,), -1))


def test_force_random_needs_enough_physical_experts() -> None:
    with pytest.raises(ValueError, match="physical experts"):
        # Two replicas of expert 0, none of the others: 2 physical experts for 5 slots.
        gate(torch.zeros(2, 4), 3, use_shared_as_routed=True, num_shared_experts=2,
             force_random=torch.ones(2, dtype=torch.bool), to_physical_map=MAP.repeat(2, 1)[:6],
             logical_count=torch.tensor([2, 0, 0, 0, 0, 0], dtype=torch.int32))
    with pytest.raises(ValueError, match="physical experts"):
        force_random_route(2, 5, 4, 0)


def test_non_finite_logits_of_routed_tokens() -> None:
    logits = torch.zeros(3, 8)
    logits[2, 5] = float("-inf")
    with pytest.raises(ValueError, match="finite"):
        gate(logits, 2)
    gate(logits, 2, mask=torch.tensor([True, True, False]))


@pytest.mark.parametrize("bad", [-1, 8])
def test_fixed_indices_out_of_range(bad: int) -> None:
    given = i64([[0, 1], [2, bad]])
    with pytest.raises(ValueError, match="unmapped_topk_idx"):
        gate(torch.zeros(2, 8), 2, fix_routing_mask=torch.ones(2, dtype=torch.bool), unmapped_topk_idx=given)
    gate(torch.zeros(2, 8), 2, fix_routing_mask=torch.tensor([True, False]), unmapped_topk_idx=given)


def test_bad_arguments() -> None:
    logits = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="scoring_func"):
        gate(logits, 2, scoring_func="sigmoid")
    with pytest.raises(ValueError, match="unmapped_topk_idx"):
        gate(logits, 2, fix_routing_mask=torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="num_shared_experts"):
        gate(logits, 2, use_shared_as_routed=True, num_shared_experts=3)
    with pytest.raises(ValueError, match="num_topk"):
        gate(logits, 9)
    with pytest.raises(ValueError, match="together"):
        gate(logits, 2, image_bias=torch.zeros(8))
    with pytest.raises(ValueError, match="flavor"):
        gate(logits, 2, flavor="rocm")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_no_tokens(flavor: str) -> None:
    idx, weights, unmapped, scores = gate(torch.zeros(0, 16), 4, use_shared_as_routed=True, num_shared_experts=2,
                                          force_random=torch.zeros(0, dtype=torch.bool), flavor=flavor)
    assert tuple(idx.shape) == (0, 6) and tuple(weights.shape) == (0, 6)
    assert tuple(unmapped.shape) == (0, 4) and tuple(scores.shape) == (0, 16)
