"""PyTorch reference of ``batched_transpose_weight_sf``, written from the specification.

Per weight with power-of-two block scales ``sf`` of shape ``(G, n/bs, k/bs)`` (or 2-D): the
UE8M0 exponent byte of each scale is ``bits >> 23``; ``sf0`` packs them along K (``pf`` per
word, byte ``j`` the ``j``-th scale of the word) and repeats each block row's words over its
``bs`` weight rows, stored ``[G][P0][n]``; ``sf1`` packs them along N and repeats each block
column's words over its ``bs`` weight columns, stored ``[G][P1][k]``.
"""

from __future__ import annotations

import torch

from vmi_core.formats import f32_bits, ue8m0_pack
from vmi_core.targets import Flavor, get_flavor

# +0 and the positive powers of two have neither a sign nor a mantissa bit.
NOT_POW2_BITS = 0x807FFFFF
INF_BITS = 0x7F800000


def check_power_of_two_scales(sf: torch.Tensor, name: str) -> None:
    """Raise ``ValueError`` naming ``name`` unless every element of ``sf`` is +0 or a finite
    positive power of two (a normal fp32 with no mantissa bits)."""
    bits = f32_bits(sf)
    bad = ((bits & NOT_POW2_BITS) != 0) | (bits == INF_BITS)
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} must hold +0 or positive powers of two (UE8M0 scales), got "
                         f"{sf[index].item()!r} at {index}")


def _exponents(sf: torch.Tensor) -> torch.Tensor:
    return (f32_bits(sf) >> 23) & 0xFF


def _one_weight(sf: torch.Tensor, block_size: int, transpose_sf1: bool, flavor: Flavor):
    grouped = sf.dim() == 3
    scales = sf if grouped else sf.unsqueeze(0)
    pf = flavor.ue8m0_pack
    sf0, sf1 = [], []
    for group in scales:
        exps = _exponents(group)
        # (n/bs, P0) words -> each block row over its bs weight rows -> stored (P0, n).
        sf0.append(ue8m0_pack(exps, pf, 1).repeat_interleave(block_size, 0).t().contiguous())
        # (P1, k/bs) words -> each block column over its bs weight columns -> stored (P1, k).
        sf1.append(ue8m0_pack(exps, pf, 0).repeat_interleave(block_size, 1).contiguous())
    sf0 = torch.stack(sf0).transpose(1, 2)
    sf1 = torch.stack(sf1)
    if not transpose_sf1:
        sf1 = sf1.transpose(1, 2)
    if not grouped:
        sf0, sf1 = sf0[0], sf1[0]
    return sf0, sf1


def batched_transpose_weight_sf(sf, block_size: int, transpose_sf1s, *, flavor: str | Flavor = "ascend"):
    """``[(sf0, sf1), ...]`` per weight of ``sf`` (see the module docstring): ``sf0`` of logical shape
    ``(*G, n, P0)`` with strides ``(P0*n, 1, n)``; ``sf1`` ``(*G, k, P1)`` with strides
    ``(P1*k, 1, k)``, or ``(*G, P1, k)`` contiguous when transposed. Words are the flavor's
    (int16 pairs for ``ascend``, int32 quads for ``cuda``). Raises ``ValueError`` naming the
    weight when a scale is not +0 or a finite positive power of two."""
    flavor = get_flavor(flavor)
    for i, s in enumerate(sf):
        check_power_of_two_scales(s, f"sf[{i}]")
    return [_one_weight(s, block_size, t, flavor) for s, t in zip(sf, transpose_sf1s, strict=True)]
