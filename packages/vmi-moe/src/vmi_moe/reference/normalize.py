"""PyTorch reference of the weight normalisation (MoE spec §4.2).

The row sum is taken in the order of the flavor's kernel, one fp32 rounding per
add, and ``1e-20`` is added last, so an all-zero row gives weights 0, not NaN.
"""

import torch

from vmi_core.targets import Flavor, get_flavor

EPSILON = 1e-20
WARP_LANES = 32


def _butterfly_sum(columns: list[torch.Tensor]) -> torch.Tensor:
    """Lane 0 of a 32-lane xor butterfly (masks 16, 8, 4, 2, 1) over the given columns; absent lanes hold 0."""
    lanes = list(columns)
    width = len(lanes)
    mask = WARP_LANES // 2
    while mask:
        for j in range(width):
            if not j & mask and j ^ mask < width:
                lanes[j] = lanes[j] + lanes[j ^ mask]
        mask //= 2
    return lanes[0]


def denominator(values: torch.Tensor, flavor: str | Flavor = "ascend") -> torch.Tensor:
    """fp32 ``[T]``: the row sum of fp32 ``values [T, K]`` (K <= 32) in the flavor's order, plus ``1e-20``.

    ascend: left to right; cuda: the xor butterfly of a 32-lane warp.
    """
    name = get_flavor(flavor).name
    if values.dim() != 2 or values.dtype != torch.float32:
        raise ValueError(f"values must be a 2-D float32 tensor, got {values.dtype} of shape {tuple(values.shape)}")
    width = values.shape[1]
    if not 1 <= width <= WARP_LANES:
        raise ValueError(f"values must have 1 to {WARP_LANES} columns, got {width}")
    columns = [values[:, j] for j in range(width)]
    if name == "cuda":
        total = _butterfly_sum(columns)
    else:
        total = columns[0]
        for column in columns[1:]:
            total = total + column
    epsilon = torch.tensor(EPSILON, dtype=torch.float32, device=values.device)
    return total + epsilon


def normalize_weight(topk_weights: torch.Tensor,
                     flavor: str | Flavor = "ascend") -> tuple[torch.Tensor, torch.Tensor]:
    """``(denominator [T], topk_weights / denominator [T, K])``, each quotient one IEEE fp32 division."""
    denom = denominator(topk_weights, flavor)
    return denom, topk_weights / denom[:, None]
