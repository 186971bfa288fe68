"""The inputs, sizes and checks the ``vmi`` command uses, shared by several of vmi-moe's ops.

Each op's ``Command`` (beside its ``KernelOp``) takes shapes ``(tokens, experts)``. ``topk_gate``,
``normalize_weight`` and ``moe_topk_gate_forward`` (indices, weights and scores: its scores use
the correctly rounded exp/log1p, the reference's bits) are checked bit for bit. The backward is
checked against the float64 reference within the spec's tolerance (``close``).
"""

from __future__ import annotations

import torch

from vmi_core.library import support
from vmi_core.tools.testing import generator

# The routed_scaling_factor of the gate and its backward.
SCALE = 1.5
# Padded (masked) tokens at the tail of the batch, as a fraction of the tokens.
PADDED_FRACTION = 0.01
# ``vmi source`` shows the kernels specialised for this many experts (the default shapes').
SOURCE_EXPERTS = 256

SUPPORT = support("SIMD and SIMT vector regions", cpu="checked against the reference in both flavors",
                  ascend_sim="checked against the reference (ascend flavor)")
# The ops checked bit for bit (the default wording), by the regions they lower to.
SIMT_SUPPORT = support("SIMT vector regions")
SIMD_SIMT_SUPPORT = support("SIMD and SIMT vector regions")
# Prefill sizes (throughput) and decode sizes (1, 4, 16 tokens: microseconds per call).
SHAPES = ((16384, 256), (4096, 384), (1024, 72), (1, 256), (4, 256), (16, 256))


def routing(shape, options, seed) -> torch.Tensor:
    """int64 ``[tokens, num_topk]``: ``options["num_topk"]`` distinct ids per token out of ``shape[1]``,
    about 2% of the entries ``-1`` (unused slots)."""
    num_tokens, num_ids = shape
    g = generator(seed)
    idx = torch.rand(num_tokens, num_ids, generator=g).argsort(dim=1)[:, :options["num_topk"]]
    idx[torch.rand(idx.shape, generator=g) < 0.02] = -1
    return idx.contiguous()


def padding_mask(num_tokens: int) -> torch.Tensor:
    """The per-token mask with the last ``PADDED_FRACTION`` of the tokens padded (False)."""
    mask = torch.ones(num_tokens, dtype=torch.bool)
    mask[num_tokens - int(num_tokens * PADDED_FRACTION):] = False
    return mask


def close(name, actual, wanted, rtol, atol) -> list[str]:
    """Mismatch lines of ``actual`` against ``wanted`` outside ``rtol``/``atol`` (empty when close)."""
    actual = actual.cpu()
    if actual.shape != wanted.shape:
        return [f"  {name}: shape {tuple(actual.shape)} vs expected {tuple(wanted.shape)}"]
    bad = ~torch.isclose(actual, wanted, rtol=rtol, atol=atol)
    if not bad.any():
        return []
    first = tuple(int(i) for i in bad.nonzero()[0])
    return [f"  {name}: {int(bad.sum())} values outside rtol={rtol:g} atol={atol:g}, first at {first}: "
            f"{actual[first].item()!r} vs {wanted[first].item()!r}"]
