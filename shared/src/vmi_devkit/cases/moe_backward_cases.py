"""moe_topk_gate_backward's kernel cases and checks, shared by its run tests and property tests.

``Case``: one kernel specialisation (E, K, flavor, aux term); ``CASES``, ``SIM_CASES`` and
``FULL_CASES`` the sets the tests run; ``sizes``/``sim_sizes`` the token and sequence counts of
one case; ``gate_data`` the forward quantities (from the cpu forward kernel) and upstream
gradients; ``assert_matches_reference`` the spec's tolerance and the element-wise fp32 rounding
bound (``rounding_bound``); ``assert_positive_zero_rows`` the +0.0 rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.tools.testing import generator
from vmi_devkit.cases.moe_cases import SIM_CORES
from vmi_moe import moe_topk_gate_backward, moe_topk_gate_forward
from vmi_moe.kernels.moe_topk_gate_backward import GateBackwardSpec
from vmi_moe.reference import moe_topk_gate_backward as reference_backward

SCALE = 1.5
UNIT = 2.0**-24  # fp32 unit roundoff


@dataclass(frozen=True)
class Case:
    """One kernel specialisation."""

    E: int
    K: int
    flavor: str
    aux: bool

    def __str__(self) -> str:
        return f"E{self.E}-K{self.K}-{self.flavor}-{'aux' if self.aux else 'noaux'}"


# Both flavors with and without the auxiliary term at E = 72 (not a multiple of 32); the
# widest gate of TileKernels' tests; the widest rows; narrow gates with K = 32 and K = 1.
# Between them they use work tiles of 128, 64 and 16 rows.
CASES = [
    Case(72, 6, "ascend", True), Case(72, 6, "cuda", True), Case(72, 6, "ascend", False), Case(72, 6, "cuda", False),
    Case(256, 8, "ascend", True), Case(384, 8, "cuda", True), Case(384, 8, "ascend", False),
    Case(40, 32, "ascend", True), Case(8, 1, "cuda", True),
]
# The ascend case that runs on ascend-sim by default (work tiles of 64 rows, the aux term; its Ascend
# lowering alone takes ~16 s); the slow run adds the others (16-row tiles at E = 384, E = 72 without
# the aux term, E = 256, K = 32).
SIM_CASES = [Case(72, 6, "ascend", True)]
FULL_CASES = [Case(e, k, flavor, aux) for e, k in [(36, 6), (72, 6), (72, 8), (256, 8), (384, 8), (64, 1), (72, 32),
                                                   (384, 32)]
              for flavor in ("ascend", "cuda") for aux in (False, True)] + [
    Case(72, 2, "cuda", True), Case(64, 4, "ascend", False), Case(256, 16, "cuda", True)]


def spec_of(case: Case) -> GateBackwardSpec:
    return GateBackwardSpec(case.E, case.K, case.flavor, case.aux)


def sizes(case: Case) -> list[tuple[int, int]]:
    """``(num_tokens, num_sequences)`` pairs: sequence boundaries inside work tiles, one token per sequence."""
    bm = spec_of(case).block_m
    tokens_per_seq = bm // 2 + 5
    if case.aux:
        return [(0, 2), (1, 1), (33, 3), (3 * tokens_per_seq, 3), (2 * (bm + 7), 2), (bm + 3, bm + 3)]
    return [(0, 1), (1, 1), (33, 3), (bm + 1, 1), (5 * bm - 3, 1)]


def sim_sizes(case: Case) -> list[tuple[int, int]]:
    """``sizes`` plus two with more work tiles than twice the simulated cores (the two buffer versions
    of every core's tiles are reused), third and fourth so that cycling ``SIM_SCHEDULES`` runs them
    consumers first and producers first. With the aux term: five sequences of ``39 bm - 1`` tokens
    (195 tiles, boundaries inside tiles) and one token per sequence over 129 tiles; without:
    3 tiles per core with a 5-token tail, and 129 tiles."""
    bm = spec_of(case).block_m
    if case.aux:
        wrapping = [(5 * (39 * bm - 1), 5), (2 * SIM_CORES * bm + 1, 2 * SIM_CORES * bm + 1)]
    else:
        wrapping = [((3 * SIM_CORES - 1) * bm + 5, 1), (2 * SIM_CORES * bm + 1, 1)]
    small = sizes(case)
    return [*small[:2], *wrapping, *small[2:]]


@dataclass
class GateData:
    """The saved quantities of a forward pass plus upstream gradients."""

    scores: torch.Tensor
    topk_idx: torch.Tensor  # the forward's unmapped_topk_idx
    weights: torch.Tensor
    grad: torch.Tensor
    mask: torch.Tensor  # tokens in the auxiliary statistic
    h: torch.Tensor
    dead: torch.Tensor  # masked and force-random tokens: no expert, scores 0

    def args(self) -> tuple:
        return self.scores, self.topk_idx, self.weights, self.grad, SCALE

    def aux(self, case: Case) -> dict:
        return {"mask": self.mask, "grad_scores_sum": self.h} if case.aux else {}


def tail_padding(num_tokens: int, num_seqs: int) -> torch.Tensor:
    """The forward mask: the last sixth of every sequence padded (every fifth token for short sequences)."""
    mask = torch.ones(num_tokens, dtype=torch.bool)
    tokens_per_seq = num_tokens // num_seqs
    if tokens_per_seq >= 6:
        pad = tokens_per_seq // 6
        for seq in range(num_seqs):
            mask[(seq + 1) * tokens_per_seq - pad:(seq + 1) * tokens_per_seq] = False
    else:
        mask[4::5] = False
    return mask


def gate_data(case: Case, num_tokens: int, num_seqs: int, seed: int) -> GateData:
    """Forward quantities and random upstream gradients. The forward always runs the ascend
    flavor (one forward kernel per (E, K)): the backward takes any scores and weights."""
    g = generator(seed)
    E, K = case.E, case.K
    logits = torch.randn(num_tokens, E, generator=g) * 2.0
    bias = torch.randn(E, generator=g) * 0.5
    mask = tail_padding(num_tokens, num_seqs)
    fixed = torch.rand(num_tokens, generator=g) < 0.3
    given = torch.randint(0, E, (num_tokens, K), generator=g)
    if K > 1:
        # Not on token 0: a single token whose route terms cancel leaves the spec's tolerance,
        # relative to the largest element, nothing to work with.
        given[1::3, 1] = given[1::3, 0]
        given[3::7] = given[3::7, :1]
    force = torch.rand(num_tokens, generator=g) < 0.1
    scores = torch.full((num_tokens, E), float("nan"))
    unmapped = given.clone()
    _, weights = moe_topk_gate_forward(logits, K, False, 0, SCALE, 0, mask=mask, bias=bias, fix_routing_mask=fixed,
                                       unmapped_topk_idx=unmapped, force_random=force, scores=scores, target="cpu",
                                       flavor="ascend")
    dead = ~mask | force
    in_statistic = ~dead & (torch.rand(num_tokens, generator=g) >= 0.1)
    return GateData(scores, unmapped, weights[:, :K].contiguous(), torch.randn(num_tokens, K, generator=g),
                    in_statistic, torch.randn(num_seqs, E, generator=g), dead)


def run(case: Case, data: GateData, target: str = "cpu", **call) -> torch.Tensor:
    return moe_topk_gate_backward(*data.args(), **data.aux(case), target=target, flavor=case.flavor, **call)


def dscore(u: torch.Tensor) -> torch.Tensor:
    """``d sqrt(softplus(x)) / dx`` from ``u`` in float64, 0 where ``u = 0``."""
    positive = u > 0
    safe = torch.where(positive, u, 1.0)
    return torch.where(positive, -torch.expm1(-safe * safe) / (2.0 * safe), 0.0)


def rounding_bound(scores, topk_idx, weights, grad, mask=None, grad_scores_sum=None) -> torch.Tensor:
    """An element-wise bound (float64 ``[T, E]``) on ``|kernel - fp32 reference|``.

    With ``u`` the fp32 unit roundoff and first-order error terms (``gamma_n = n u``):

    * route term ``r_e = sum_{j: i_j = e} (s g_j - <g, w>) / D``: ``D`` and ``<g, w>`` are
      fp32 sums of K terms, then per slot a product, a subtraction and a division, and the
      slots of a duplicated expert add up: error <= (3K + 3) u R_e with
      ``R_e = sum_{j: i_j = e} (|s g_j| + sum_k |g_k w_k|) / D``;
    * aux term ``a_e = (h_e - <h, u> / U) / U`` (or its expanded form): ``U`` and ``<h, u>``
      are fp32 sums of E terms and ``1 / U`` enters twice: error <= (3E + 4) u A_e with
      ``A_e = (|h_e| + sum |h u| / U) / U``;
    * ``r + a`` (one rounding), ``y'(u)`` from the fp32 ``u`` (within 1.5e-7 < 2.6 u relative,
      spec §1.5), the product, and the reference's own rounding to fp32: at most 6 u times
      ``y' (R + A)`` together, as ``|r_e| <= R_e`` and ``|a_e| <= A_e``.

    Hence ``|kernel - reference| <= u y' ((3K + 10) R + (3E + 10) A)``. Elements outside the
    selection without the aux term, and rows with ``u = 0``, must match exactly. Measured: the
    error reaches about a tenth of the bound at most (17 u y' (R + A) at E = 384, 4.4 u y' R
    without the aux term at E = 72); relative to ``max |reference|`` it is 0.7e-7 to 2.3e-7.
    """
    u = scores.double()
    valid = topk_idx >= 0
    slot = topk_idx.clamp(min=0)
    g = torch.where(valid, grad.double(), 0.0)
    d = torch.where(valid, u.gather(1, slot), 0.0).sum(dim=1, keepdim=True) + 1e-20
    gw = (g * weights.double()).abs().sum(dim=1, keepdim=True)
    route = torch.zeros_like(u).scatter_add_(1, slot, torch.where(valid, (SCALE * g.abs() + gw) / d, 0.0))
    aux = torch.zeros_like(u)
    if grad_scores_sum is not None and u.shape[0]:
        h = grad_scores_sum.double().repeat_interleave(u.shape[0] // grad_scores_sum.shape[0], dim=0)
        total = u.sum(dim=1, keepdim=True)
        live = mask.reshape(-1, 1) & (total > 0)
        safe = torch.where(live, total, 1.0)
        aux = torch.where(live, (h.abs() + (h * u).abs().sum(dim=1, keepdim=True) / safe) / safe, 0.0)
    num_topk, num_experts = topk_idx.shape[1], u.shape[1]
    return UNIT * dscore(u) * ((3 * num_topk + 10) * route + (3 * num_experts + 10) * aux)


def assert_matches_reference(got: torch.Tensor, args: tuple, aux: dict, label: str,
                             spec_tolerance: bool = True) -> None:
    ref = reference_backward(*args, **aux)
    assert got.dtype == torch.float32 and got.shape == ref.shape, label
    if spec_tolerance:  # the spec's criterion (§6.8)
        atol = 1e-5 * ref.abs().max().item() if ref.numel() else 0.0
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=atol, msg=lambda m: f"{label}: {m}")
    bound = rounding_bound(*args[:4], **aux)
    err = (got.double() - ref.double()).abs()
    bad = ~(err <= bound)  # NaN fails
    if bool(bad.any()):
        t, e = bad.nonzero()[0].tolist()
        raise AssertionError(f"{label}: {int(bad.sum())} elements beyond the rounding bound; first at ({t}, {e}): "
                             f"got {got[t, e].item()!r}, reference {ref[t, e].item()!r}, "
                             f"bound {bound[t, e].item():.3g}")


def assert_positive_zero_rows(got: torch.Tensor, rows: torch.Tensor, label: str) -> None:
    bits = got[rows].view(torch.int32)
    assert bool((bits == 0).all()), f"{label}: rows {rows.nonzero().flatten().tolist()[:8]} are not all +0.0"
