"""per_token_cast_and_cast_back rewrites x in place, and behaves like torch's in-place ops.

- The version counter moves, so a backward that saved x raises instead of using the
  rewritten values.
- With grad mode on, an x that requires grad is refused (the op has no derivative): a leaf
  with torch's own message. Under ``torch.no_grad()`` it works, as ``x.mul_`` would.
- An x whose elements share memory (``expand``) is refused before any kernel runs.
"""

import pytest
import torch

from vmi_core.tools.testing import assert_bitwise_equal, randn
from vmi_quant import per_token_cast_and_cast_back, reference

# The simulator builds for these error paths run in the slow run.
TARGETS = ["cpu", pytest.param("ascend-sim", marks=pytest.mark.slow)]


def _round_trip(x: torch.Tensor) -> torch.Tensor:
    return reference.cast_and_cast_back(x, "e4m3", 32, flavor="ascend")


@pytest.mark.parametrize("target", TARGETS)
def test_a_saved_tensor_rewritten_in_place_fails_the_backward(target):
    a = randn((40, 128), 1, torch.float32).requires_grad_()
    h = a.exp()  # exp saves its output for the backward
    version = h._version
    with torch.no_grad():
        per_token_cast_and_cast_back(h, "e4m3", 32, target=target)
    assert h._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        h.sum().backward()


@pytest.mark.parametrize("target", TARGETS)
def test_tensors_that_require_grad_are_refused_in_grad_mode(target):
    leaf = randn((40, 128), 2, torch.float32).requires_grad_()
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        per_token_cast_and_cast_back(leaf, "e4m3", 32, target=target)
    with pytest.raises(RuntimeError, match="rewrites x in place and has no derivative"):
        per_token_cast_and_cast_back(leaf * 2, "e4m3", 32, target=target)
    with torch.no_grad():
        expected = _round_trip(leaf.detach())
        per_token_cast_and_cast_back(leaf, "e4m3", 32, target=target)
    assert_bitwise_equal(leaf.detach(), expected)


def test_an_x_whose_elements_share_memory_is_refused():
    row = randn((1, 128), 3, torch.bfloat16)
    with pytest.raises(ValueError, match="x rows must not overlap"):
        per_token_cast_and_cast_back(row.expand(8, 128), "e4m3", 32)
    assert_bitwise_equal(row, randn((1, 128), 3, torch.bfloat16), "x was written")
