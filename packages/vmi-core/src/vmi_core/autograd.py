"""What the families' ``torch.autograd.Function``s share: backward kernels give first derivatives only.

``torch.autograd.function.once_differentiable`` refuses a second derivative only when an incoming
gradient requires grad. After ``torch.autograd.grad(out.sum(), x, create_graph=True)`` none does
(the gradient of a sum is a constant), so the result comes back detached and a second ``grad``
silently misses the second-order terms through the saved inputs (zero, or None with
``allow_unused``). ``first_order`` links the gradients, under ``create_graph``, to what they depend
on (the saved tensors and the incoming gradients) through a node that raises when differentiated,
naming the Function.
"""

from __future__ import annotations

import functools

import torch


class _NotDifferentiable(torch.autograd.Function):
    """Passes its first ``count`` tensors through, depending on all of them; differentiating the
    results raises naming ``function``."""

    @staticmethod
    def forward(ctx, function: str, count: int, *tensors):
        ctx.function = function
        # Fresh tensors on the same memory: no copy, and not views the caller could trip over.
        return tuple(t.detach() for t in tensors[:count])

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(f"{ctx.function} has no second derivative: its backward kernel gives first "
                           f"derivatives only (differentiate a torch composition instead)")


def first_order(backward=None, *, name: str | None = None):
    """Decorate a Function's ``backward`` (or a ``torch.library.register_autograd`` backward, with
    the op's ``name``): run it without recording; under ``create_graph`` its gradients can be used
    but not differentiated (doing so raises ``RuntimeError`` naming the Function or op). A gradient
    that depends on nothing differentiable (a linear Function's, for a constant incoming gradient)
    comes back plain, as torch's own linear ops give it."""
    if backward is None:
        return functools.partial(first_order, name=name)
    function = name or backward.__qualname__.rpartition(".")[0]

    @functools.wraps(backward)
    def wrapper(ctx, *grad_outputs):
        with torch.no_grad():
            grads = backward(ctx, *grad_outputs)
        if not torch.is_grad_enabled():
            return grads
        sources = [t for t in (*ctx.saved_tensors, *grad_outputs) if isinstance(t, torch.Tensor) and t.requires_grad]
        single = not isinstance(grads, tuple)
        grads = (grads,) if single else grads
        present = [i for i, g in enumerate(grads) if isinstance(g, torch.Tensor)]
        if not sources or not present:
            return grads[0] if single else grads
        guarded = _NotDifferentiable.apply(function, len(present), *(grads[i] for i in present), *sources)
        out = list(grads)
        for i, g in zip(present, guarded, strict=True):
            out[i] = g
        return out[0] if single else tuple(out)

    return wrapper
