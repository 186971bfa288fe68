"""``y = sqrt(softplus(x))`` and its derivative from ``y``, in torch (MoE spec §1.2-§1.5).

The torch twins of the kernel macros of ``vmi_moe.tl.softplus``, written from the spec: each
flavor's sequence of fp32 operations, with the correctly rounded ``exp``/``log1p`` of
``vmi_core.fp32`` (the twins of the kernels' ``exp``/``log1p``) and one fp32 rounding per
operation, so a kernel gives these bits on every target. The fp32 values are held in float64 and
rounded after each step (``vmi_core.fp32.round_held``): one correct rounding for ``+ - * /`` and
``sqrt``, as float64 carries more than twice fp32's precision (torch's own float32 ``sqrt`` on the
CPU is not correctly rounded for every input); each fused multiply-add is ``vmi_core.fp32.fma_held``.

* ``cuda`` flavor (§1.2): ``sqrt(x > 20 ? x : log1p(exp(x)))`` (beta 1, threshold 20, as
  ``F.softplus(x).sqrt()``, TileKernels' reference off Ascend, whose torch ``exp``/``log1p`` are
  not correctly rounded: within 2 ulp of these bits, ``sqrt_softplus_torch``).
* ``ascend`` flavor (§1.3): ``a = exp(fl(|x|·(-0.5)))``, ``t = fl(1 - fl(a·a))``, a degree-8 FMA
  Horner polynomial ``p(t)``, ``g = fma(t, p, G0)``, ``l = fl(a·g)``; for ``x > 0`` the
  Newton-refined square root of ``s = fma(l, l, x)``, else ``l``. Within 2 ulp of the correctly
  rounded value (``sqrt_softplus_f64``, TileKernels' reference on Ascend).

The derivative ``dy/dx = sigmoid(x) / (2y) = (1 - e^(-y^2)) / (2y)`` depends on ``y`` only, the
same for both flavors (§1.5): with ``u = fl(y·y)`` and ``h = fl(0.5·y)``, for ``u < 1`` the
polynomial ``fma(fl(u·q(u)), h, h)`` (``q`` by FMA Horner), else
``fl(fl(fl(1 - exp(-u)) / y) · 0.5)``; within 1.8e-7 (relative) of ``sqrt_softplus_grad_f64``.

Inputs may live on any device; the twins compute on the CPU and return a tensor on the input's
device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vmi_core import fp32
from vmi_core.fp32 import fma_held, round_held
from vmi_core.targets import Flavor, get_flavor

CUDA_THRESHOLD = 20.0

# Spec §1.3: the coefficients c8 ... c0 of the Ascend forward's P(t), highest degree first, and G0,
# fp32(sqrt(ln 2)).
ASCEND_P = (4.71802573883906e-4, -4.226923920214176e-4, -8.536428504157811e-5, 2.192076062783599e-3,
            2.92900949716568e-4, 4.986039828509092e-3, 1.1144610121846199e-2, 3.287079185247421e-2,
            1.1599518358707428e-1)
G0 = 0.8325546383857727

# Spec §1.5: the coefficients q5 ... q0 of the backward's Q(u), highest degree first.
BACKWARD_Q = (1.29130945e-4, -1.30112655e-3, 8.27621203e-3, -4.1647464e-2, 1.66663632e-1, -4.99999821e-1)


def _check_f32(t: torch.Tensor, name: str) -> None:
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {t.dtype}")


def _f32(value: float) -> float:
    """The fp32 constant ``value`` (rounded once), as a Python float."""
    return fp32.value(value)


def _horner_fma(coeffs, t: torch.Tensor) -> torch.Tensor:
    """``p = coeffs[0]``, then ``p = fma(p, t, coeffs[k])`` for the rest (fp32 values held in float64)."""
    p = torch.full_like(t, _f32(coeffs[0]))
    for coeff in coeffs[1:]:
        p = fma_held(p, t, _f32(coeff))
    return p


def _forward_cuda(x: torch.Tensor) -> torch.Tensor:
    sp = torch.where(x > CUDA_THRESHOLD, x, fp32.log1p(fp32.exp(x)))
    return round_held(torch.sqrt(sp.double())).to(torch.float32)


def _forward_ascend(x32: torch.Tensor) -> torch.Tensor:
    x = x32.double()
    a = round_held(torch.exp(round_held(x.abs() * -0.5)))      # 1. a = e^(-|x|/2), correctly rounded
    t = round_held(1.0 - round_held(a * a))                     # 2. t = 1 - e^(-|x|), two roundings
    g = fma_held(t, _horner_fma(ASCEND_P, t), _f32(G0))         # 3-4. g ~ sqrt(ln(1 + q) / q)
    l = round_held(a * g)                                       # 5. l ~ sqrt(ln(1 + e^(-|x|)))
    s = fma_held(l, l, x.clamp_min(0.0))                        # 6. s = relu(x) + l^2, one rounding
    r0 = round_held(torch.sqrt(s))
    rho = round_held(1.0 / r0)
    r1 = round_held(round_held(r0 + round_held(s * rho)) * 0.5)  #    one Newton step
    e = fma_held(r1, r1, -s)                                    #    the residual r1^2 - s, exact
    y = fma_held(e, round_held(rho * -0.5), r1)
    return torch.where(x > 0.0, y, l).to(torch.float32)         # 7. select on x > 0


def sqrt_softplus(x: torch.Tensor, flavor: str | Flavor = "ascend") -> torch.Tensor:
    """``sqrt(softplus(x))`` of a float32 tensor, the ``flavor``'s fp32 operations with the correctly
    rounded ``exp``/``log1p``: the kernels' bits (see the module docstring)."""
    _check_f32(x, "x")
    flavor = get_flavor(flavor)
    xc = x.detach().cpu()
    y = _forward_cuda(xc) if flavor.name == "cuda" else _forward_ascend(xc)
    return y.to(x.device)


def sqrt_softplus_grad(y: torch.Tensor, flavor: str | Flavor = "ascend") -> torch.Tensor:
    """``d sqrt(softplus(x)) / dx`` from ``y = sqrt(softplus(x))`` (float32, ``y >= 0``): spec §1.5's
    fp32 operations with the correctly rounded ``exp``, the kernels' bits; the same for both flavors.

    ``y = 0`` gives +0.0 (padded tokens), ``y = inf`` 0, NaN stays NaN.
    """
    _check_f32(y, "y")
    get_flavor(flavor)
    yd = y.detach().cpu().double()
    u = round_held(yd * yd)
    h = round_held(0.5 * yd)
    small = fma_held(round_held(u * _horner_fma(BACKWARD_Q, u)), h, h)                      # A: (y/2) (1 + u Q(u))
    large = round_held(round_held(round_held(1.0 - round_held(torch.exp(-u))) / yd) * 0.5)  # B: (1 - e^(-u)) / (2y)
    return torch.where(u < 1.0, small, large).to(torch.float32).to(y.device)


# --- float64 values, for accuracy checks ----------------------------------------------------------

def sqrt_softplus_f64(x: torch.Tensor) -> torch.Tensor:
    """``sqrt(max(x, 0) + log1p(exp(-|x|)))`` in float64, rounded once to fp32: correctly rounded up
    to the float64 error (TileKernels' Ascend reference, spec §1.4); no threshold, non-zero tail down
    to x ~ -206.6."""
    _check_f32(x, "x")
    xd = x.detach().to("cpu", torch.float64)
    y = torch.sqrt(xd.clamp_min(0.0) + torch.log1p(torch.exp(-xd.abs())))
    return y.to(torch.float32).to(x.device)


def sqrt_softplus_torch(x: torch.Tensor) -> torch.Tensor:
    """``F.softplus(x).sqrt()`` in fp32 (threshold 20): TileKernels' reference off Ascend (spec §1.4)."""
    _check_f32(x, "x")
    return F.softplus(x, beta=1.0, threshold=CUDA_THRESHOLD).sqrt()


def sqrt_softplus_grad_f64(y: torch.Tensor) -> torch.Tensor:
    """``-expm1(-y^2) / (2y)`` in float64 for ``y > 0``, else 0 (NaN stays NaN), rounded to fp32: the
    derivative's reference of spec §1.5."""
    _check_f32(y, "y")
    yd = y.detach().to("cpu", torch.float64)
    positive = yd > 0
    safe = torch.where(positive, yd, torch.ones_like(yd))
    grad = torch.where(positive, -torch.expm1(-safe * safe) / (2.0 * safe), torch.zeros_like(yd))
    grad = torch.where(yd.isnan(), yd, grad)
    return grad.to(torch.float32).to(y.device)
