"""``y = sqrt(softplus(x))`` and its derivative from ``y``, in torch (MoE spec §1.4, §1.5).

The references the kernel macros of ``vmi_core.tl.softplus`` are judged against:

* ``cuda`` flavor: ``F.softplus(x).sqrt()`` in fp32 (beta 1, threshold 20: ``x > 20``
  gives ``sqrt(x)``), as TileKernels' reference off Ascend.
* ``ascend`` flavor: ``sqrt(max(x, 0) + log1p(exp(-|x|)))`` in fp64 on the CPU, rounded
  once to fp32 — correctly rounded up to the fp64 error, with no threshold and a
  non-zero tail down to x ~ -206.6.

The derivative ``dy/dx = sigmoid(x) / (2y) = (1 - e^(-y^2)) / (2y)`` depends on ``y``
only; both flavors use the fp64 reference ``-expm1(-u) / (2y)`` (``u = y^2``) for
``y > 0`` and 0 otherwise, rounded to fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vmi_core.targets import Flavor, get_flavor

CUDA_THRESHOLD = 20.0


def _check_f32(t: torch.Tensor, name: str) -> None:
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {t.dtype}")


def sqrt_softplus(x: torch.Tensor, flavor: str | Flavor = "ascend") -> torch.Tensor:
    """``sqrt(softplus(x))`` of a float32 tensor, as the ``flavor``'s reference computes it."""
    _check_f32(x, "x")
    if get_flavor(flavor).name == "cuda":
        return F.softplus(x, beta=1.0, threshold=CUDA_THRESHOLD).sqrt()
    xd = x.detach().to("cpu", torch.float64)
    y = torch.sqrt(xd.clamp_min(0.0) + torch.log1p(torch.exp(-xd.abs())))
    return y.to(torch.float32).to(x.device)


def sqrt_softplus_grad(y: torch.Tensor, flavor: str | Flavor = "ascend") -> torch.Tensor:
    """``d sqrt(softplus(x)) / dx`` from ``y = sqrt(softplus(x))`` (float32, ``y >= 0``).

    fp64 ``-expm1(-y^2) / (2y)`` for ``y > 0``, else 0 (padded tokens have ``y = 0``;
    NaN stays NaN), rounded to fp32; the same for both flavors.
    """
    _check_f32(y, "y")
    get_flavor(flavor)
    yd = y.detach().to("cpu", torch.float64)
    positive = yd > 0
    safe = torch.where(positive, yd, torch.ones_like(yd))
    grad = torch.where(positive, -torch.expm1(-safe * safe) / (2.0 * safe), torch.zeros_like(yd))
    grad = torch.where(yd.isnan(), yd, grad)
    return grad.to(torch.float32).to(y.device)
