"""Data construction shared by the kernel tests of topk_gate, normalize_weight and moe_topk_gate_forward.

* score/logit rows with constructed ties (all-equal rows, equal maxima across the 32- and
  64-expert boundaries, integer-valued rows) mixed into normal samples;
* replica maps laid out like TileKernels' tests (consecutive replica rows, unused cells -1),
  here with the physical ids shuffled so that a wrong replica choice shows;
* ``GateCase``: one specialisation of the gate kernel (sizes, flavor, optional inputs) and
  the helpers that run it and the reference on the same inputs;
* the targets the kernel tests run on: ``cpu`` and ``ascend-sim`` (the emitted AscendC on
  vmi-core's model of the vector core), with the token counts that make every simulated
  core wrap around its double-buffered tiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from vmi_core.tl.shell import DEFAULT_WORKERS
from vmi_core.tools.testing import assert_bitwise_equal, generator
from vmi_moe import moe_topk_gate_forward
from vmi_moe.kernels.moe_topk_gate import GateSpec
from vmi_moe.reference import moe_topk_gate_forward as reference_gate
from vmi_moe.softplus import sqrt_softplus, sqrt_softplus_f64

FLAVORS = ("ascend", "cuda")
SCALE = 1.5
G0 = 0.8325546383857727  # fp32(sqrt(ln 2)) = sqrt(softplus(0)), correctly rounded


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Bit-pattern distance of fp32 values of one sign (units in the last place), int64."""
    return (a.contiguous().view(torch.int32).to(torch.int64) - b.contiguous().view(torch.int32).to(torch.int64)).abs()


def token_counts(block_m: int) -> list[int]:
    """Token counts for a kernel with ``block_m``-row work tiles: none, one, 33, one past a tile, and
    several tiles with a tail (more than one tile per worker on two workers)."""
    return sorted({0, 1, 33, block_m + 1, max(300, 5 * block_m - 3)})


# --- targets ---------------------------------------------------------------------------------

SIM = "ascend-sim"
TARGETS = ("cpu", SIM)
# Persistent workers of an ascend launch: the vector cores ascend-sim simulates.
SIM_CORES = DEFAULT_WORKERS["ascend"]


def flavor_targets(*, sim_slow: bool = False) -> list:
    """``(flavor, target)`` parameters: both flavors on cpu, and ascend-sim with the ascend flavor (its
    only one); with ``sim_slow`` the ascend-sim one runs in the slow run only (every test process
    lowers its ascend-sim kernels anew, seconds each)."""
    sim = pytest.param("ascend", SIM, marks=pytest.mark.slow) if sim_slow else ("ascend", SIM)
    return [*((flavor, "cpu") for flavor in FLAVORS), sim]


def wrapping_counts(block_m: int) -> list[int]:
    """Token counts with more work tiles than twice the simulated cores, so that the two buffer versions
    of a core's tiles are reused: 3 tiles on every core (the last tile holding 5 tokens), and 129
    tiles (core 0 takes a third tile of one token)."""
    return [(3 * SIM_CORES - 1) * block_m + 5, 2 * SIM_CORES * block_m + 1]


def counts_on(target: str, counts: list[int], block_m: int) -> list[int]:
    """``counts`` on cpu; on ascend-sim the two ``wrapping_counts`` come third and fourth, so that a
    test cycling ``SIM_SCHEDULES`` by position runs them consumers first and producers first."""
    if target == "cpu":
        return list(counts)
    return [*counts[:2], *wrapping_counts(block_m), *counts[2:]]


# --- scores with ties ---------------------------------------------------------------------------

TIE_KINDS = 6


def with_ties(x: torch.Tensor, seed: int, every: int = 3) -> torch.Tensor:
    """A copy of ``x [T, E]`` where every ``every``-th row is rewritten with a constructed tie (kind by row).

    0: all values equal; 1: a random third of the row set to one value above the row
    maximum (ties at the top that straddle the K-th position); 2: columns 31 and 32 equal
    and above the rest; 3: columns 63 and 64 (else 0 and E-1) equal and above the rest, and
    31/32 equal just below them; 4: small integers (many ties everywhere); 5: two values only.
    """
    y = x.clone()
    num_rows, num_cols = y.shape
    g = generator(seed)
    for n, t in enumerate(range(0, num_rows, every)):
        kind = n % TIE_KINDS
        top = float(y[t].max()) + 1.0
        if kind == 0:
            y[t] = float(torch.randn(1, generator=g))
        elif kind == 1:
            y[t, torch.rand(num_cols, generator=g) < 1 / 3] = top
        elif kind == 2:
            cols = [31, 32] if num_cols > 32 else [0, num_cols - 1]
            y[t, cols] = top
        elif kind == 3:
            y[t, [63, 64] if num_cols > 64 else [0, num_cols - 1]] = top + 1.0
            if num_cols > 64:
                y[t, [31, 32]] = top
        elif kind == 4:
            y[t] = torch.randint(-2, 3, (num_cols,), generator=g).float()
        else:
            y[t] = torch.where(torch.rand(num_cols, generator=g) < 0.5, 0.5, -0.5)
    return y


def id_routing(num_tokens: int, num_ids: int, num_topk: int, seed: int, kind: str = "random") -> torch.Tensor:
    """int64 ``[T, K]`` ids of one kind of routing, the inputs of the layout and counting ops:
    ``"random"`` (distinct ids per token, ~5% of the slots unused), ``"repeats"`` (a token may name
    one id in several slots; few ids used), ``"one id"`` (every slot the last id) or ``"unused"``
    (every slot -1)."""
    g = generator(seed)
    if kind == "random":
        idx = torch.rand(num_tokens, num_ids, generator=g).argsort(dim=1)[:, :num_topk]
        idx[torch.rand(idx.shape, generator=g) < 0.05] = -1
    elif kind == "repeats":
        idx = torch.randint(-1, min(num_ids, 5), (num_tokens, num_topk), generator=g)
    elif kind == "one id":
        idx = torch.full((num_tokens, num_topk), num_ids - 1)
    else:
        idx = torch.full((num_tokens, num_topk), -1)
    return idx.contiguous()


def tie_expectations(num_cols: int, k: int) -> dict[int, list[int]]:
    """For ``with_ties`` rows of kinds 0, 2 and 3 on plain scores: the leading indices the rank order implies."""
    first = list(range(k))
    expect = {0: first}
    expect[2] = ([31, 32] if num_cols > 32 else [0, num_cols - 1])[:k]
    expect[3] = ([63, 64, 31, 32] if num_cols > 64 else [0, num_cols - 1])[:k]
    return expect


# --- replica maps -------------------------------------------------------------------------------

def physical_map(num_logical: int, dup: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(to_physical_map int32 [L, dup], logical_count int32 [L])``: counts in 1..dup (all 1 for dup 1).

    Logical expert l owns the consecutive physical slots ``offset_l .. offset_l + count_l - 1`` of
    a shuffled id list; unused cells hold -1.
    """
    g = generator(seed)
    count = torch.randint(1, dup + 1, (num_logical,), generator=g, dtype=torch.int32)
    offset = torch.cumsum(count, 0) - count
    ids = torch.randperm(int(count.sum()), generator=g).to(torch.int32)
    cols = torch.arange(dup, dtype=torch.int32)
    valid = cols[None, :] < count[:, None]
    slots = (offset[:, None] + cols[None, :]).clamp(max=ids.numel() - 1)
    return torch.where(valid, ids[slots.long()], -1).to(torch.int32).contiguous(), count.contiguous()


# --- the gate --------------------------------------------------------------------------------

@dataclass(frozen=True)
class GateCase:
    """One gate specialisation: sizes, flavor and which optional inputs are given."""

    E: int
    K: int
    S: int = 0
    dup: int = 0  # columns of the replica map; 0: no map
    flavor: str = "ascend"
    mask: bool = False
    bias: bool = False
    image: bool = False
    fixed: bool = False
    force: bool = False
    scores: bool = True
    unmapped: bool = False  # pass unmapped_topk_idx without fixed routing (output only)

    @property
    def P(self) -> int:
        return self.K + self.S

    @property
    def L(self) -> int:
        return self.E + self.S

    @property
    def id(self) -> str:
        opts = [name for name in ("mask", "bias", "image", "fixed", "force", "unmapped") if getattr(self, name)]
        if self.dup:
            opts.append(f"map{self.dup}")
        if not self.scores:
            opts.append("noscores")
        return f"E{self.E}-K{self.K}-S{self.S}-{self.flavor}" + "".join(f"-{o}" for o in opts)


def gate_spec(case: GateCase) -> GateSpec:
    """The kernel specialisation the dispatch builds for ``case``."""
    return GateSpec(case.E, case.K, case.S, case.dup or 1, case.flavor, has_mask=case.mask, has_bias=case.bias,
                    has_image=case.image, has_fixed=case.fixed, has_unmapped=case.fixed or case.unmapped,
                    has_map=bool(case.dup), has_force_random=case.force, has_scores=case.scores)


@dataclass
class GateInputs:
    logits: torch.Tensor
    options: dict  # keyword arguments of moe_topk_gate_forward (inputs only, never modified)

    @property
    def num_tokens(self) -> int:
        return self.logits.shape[0]

    def flags(self, name: str) -> torch.Tensor:
        t = self.options.get(name)
        if t is None:
            return torch.full((self.num_tokens,), name == "mask", dtype=torch.bool)
        return t.reshape(-1)

    @property
    def masked(self) -> torch.Tensor:
        return ~self.flags("mask")

    @property
    def forced(self) -> torch.Tensor:
        return self.flags("force_random") & ~self.masked

    @property
    def routed(self) -> torch.Tensor:
        return ~self.masked & ~self.forced

    @property
    def fixed(self) -> torch.Tensor:
        return self.flags("fix_routing_mask") & self.routed

    def num_physical(self, case: GateCase) -> int:
        count = self.options.get("logical_count")
        return case.L if count is None else int(count.sum())


def gate_inputs(case: GateCase, num_tokens: int, seed: int, *, padded: int = 0, ties: bool = True,
                logits: torch.Tensor | None = None) -> GateInputs:
    """Random inputs for ``case``: ``num_tokens`` rows (the last ``padded`` of them masked when the case has a mask).

    Masks: ~15% masked tokens, ~50% image tokens, ~30% fixed-routing tokens (a third of
    them with a duplicated expert), ~30% force-random tokens (some also fixed or masked, to
    exercise the precedence). Fixed experts are also given for tokens that do not use them.
    """
    g = generator(seed)
    T, E, K = num_tokens, case.E, case.K
    if logits is None:
        logits = torch.randn(T, E, generator=g) * 2.0
        if ties:
            logits = with_ties(logits, seed + 1)
    options: dict = {}
    if case.mask:
        mask = torch.rand(T, generator=g) >= 0.15
        mask[T - padded:] = False
        options["mask"] = mask
    if case.bias:
        options["bias"] = torch.randn(E, generator=g) * 0.5
    if case.image:
        options["image_bias"] = torch.randn(E, generator=g) * 0.5
        options["image_token_mask"] = torch.rand(T, generator=g) < 0.5
    if case.fixed or case.unmapped:
        given = torch.randint(0, E, (T, K), generator=g)
        if K > 1:
            given[::3, 1] = given[::3, 0]
        options["unmapped_topk_idx"] = given
    if case.fixed:
        options["fix_routing_mask"] = torch.rand(T, generator=g) < 0.3
    if case.dup:
        options["to_physical_map"], options["logical_count"] = physical_map(case.L, case.dup, seed + 2)
    if case.force:
        options["force_random"] = torch.rand(T, generator=g) < 0.3
    return GateInputs(logits, options)


def positional(case: GateCase, ep_rank: int = 0) -> tuple:
    """``(num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank)``."""
    return case.K, case.S > 0, case.S, SCALE, ep_rank


def run_kernel(case: GateCase, inp: GateInputs, ep_rank: int = 0, *, out=None, scores: bool | None = None,
               unmapped_input: torch.Tensor | None = None, **call):
    """``(topk_idx, topk_weights, unmapped, scores)`` of the kernel (``target=`` in ``call``, cpu unless
    given); ``unmapped``/``scores`` None if not given.

    ``unmapped_topk_idx`` is copied (it is written in place) unless ``unmapped_input`` names
    the tensor to pass.
    """
    options = dict(inp.options)
    if "unmapped_topk_idx" in options:
        options["unmapped_topk_idx"] = options["unmapped_topk_idx"].clone() if unmapped_input is None \
            else unmapped_input
    want_scores = case.scores if scores is None else scores
    sc = torch.full_like(inp.logits, float("nan")) if want_scores else None
    call.setdefault("target", "cpu")
    call.setdefault("flavor", case.flavor)
    idx, weights = moe_topk_gate_forward(inp.logits, *positional(case, ep_rank), out=out, scores=sc, **options,
                                         **call)
    return idx, weights, options.get("unmapped_topk_idx"), sc


def run_reference(case: GateCase, inp: GateInputs, ep_rank: int = 0, unbiased_scores: torch.Tensor | None = None):
    """The reference's ``(topk_idx, topk_weights, unmapped, scores)`` on the same inputs."""
    return reference_gate(inp.logits, *positional(case, ep_rank), **inp.options, flavor=case.flavor,
                          unbiased_scores=unbiased_scores)


def assert_scores_exact(sc: torch.Tensor, inp: GateInputs, flavor: str) -> None:
    """Kernel scores of routed rows bit for bit against the torch twin ``vmi_moe.softplus.sqrt_softplus``
    (the flavor's fp32 operations with the correctly rounded exp/log1p; 0 elsewhere is checked by the
    callers); in the ``ascend`` flavor also within 2 ulp of the correctly rounded value (spec §1.3's
    accuracy target; the twin's accuracy is tests/test_softplus.py's subject)."""
    x = inp.logits[inp.routed]
    y = sc[inp.routed]
    assert_bitwise_equal(y, sqrt_softplus(x, flavor), "scores of routed tokens")
    if flavor == "ascend" and y.numel():
        d = ulps(y, sqrt_softplus_f64(x))
        assert int(d.max()) <= 2, f"scores: {int(d.max())} ulp at logit {float(x.reshape(-1)[d.argmax()])}"


def assert_token_classes(case: GateCase, inp: GateInputs, idx, weights, unmapped, sc) -> None:
    """Reference-free facts of the output (spec §5.2's table)."""
    masked, forced, routed = inp.masked, inp.forced, inp.routed
    P, K = case.P, case.K
    assert bool((idx[masked] == -1).all()), "masked tokens must route nowhere"
    assert bool((weights[masked].view(torch.int32) == 0).all()), "masked tokens must have +0.0 weights"
    if unmapped is not None:
        assert bool((unmapped[masked | forced] == -1).all()), "unmapped must be -1 for masked/force-random tokens"
    if sc is not None:
        assert bool((sc[masked | forced].view(torch.int32) == 0).all()), "scores must be +0.0 for unrouted tokens"
    if bool(forced.any()):
        ids, w = idx[forced], weights[forced]
        num_physical = inp.num_physical(case)
        assert bool(((ids >= 0) & (ids < num_physical)).all()), "force-random ids out of range"
        assert bool((ids.sort(dim=1).values.diff(dim=1) > 0).all()), "force-random ids are not distinct"
        assert bool(((w > 0) & (w <= 1)).all()), "force-random weights outside (0, 1]"
    if bool(routed.any()):
        w = weights[routed]
        if case.S:
            assert bool((w[:, K:] == 1.0).all()), "shared-expert weights must be 1.0"
        ids = idx[routed]
        if not case.dup:
            for j in range(case.S):
                assert bool((ids[:, K + j] == case.E + j).all()), "shared slots must hold E + j"
        else:
            mp = inp.options["to_physical_map"]
            for j in range(case.S):
                assert bool(torch.isin(ids[:, K + j], mp[case.E + j][mp[case.E + j] >= 0].long()).all())
        assert bool((ids >= 0).all())
        assert tuple(idx.shape) == (inp.num_tokens, P)
