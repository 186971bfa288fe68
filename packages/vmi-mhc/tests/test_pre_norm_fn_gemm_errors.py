"""Bad arguments of the prenorm GEMM's forward and backward raise the documented error, naming the
argument, before any kernel runs: the outputs and the accumulation buffer keep their values."""

from __future__ import annotations

import pytest
import torch

from vmi_mhc import mhc_pre_norm_fn_gemm_bwd, mhc_pre_norm_fn_gemm_fwd

T, K, MIX = 5, 512, 24


def forward_args() -> dict:
    return {"x": torch.ones(T, K, dtype=torch.bfloat16), "fn": torch.ones(MIX, K),
            "out_mul_splitted": torch.full((2, T, MIX), 7.0), "sqrsum_splitted": torch.full((2, T), 7.0),
            "n_splits": 2}


def backward_args() -> dict:
    return {"out_mul_grad": torch.ones(T, MIX), "sqrsum_grad": torch.ones(T),
            "x": torch.ones(T, K, dtype=torch.bfloat16), "fn": torch.ones(MIX, K),
            "x_grad": torch.full((T, K), 7.0, dtype=torch.bfloat16), "fn_grad": torch.full((MIX, K), 7.0)}


FORWARD_CASES = [
    ("x", "not a tensor", TypeError, "x must be a torch.Tensor"),
    ("x", torch.ones(T, K), TypeError, "x must be torch.bfloat16"),
    ("x", torch.ones(T, K, 1, dtype=torch.bfloat16), ValueError, "x must be 2-D"),
    ("x", torch.ones(K, T, dtype=torch.bfloat16).t(), ValueError, "x must be contiguous"),
    ("fn", torch.ones(MIX, K, dtype=torch.float64), TypeError, "fn must be torch.float32"),
    ("fn", torch.ones(0, K), ValueError, "fn must have between 1 and 32 rows"),
    ("fn", torch.ones(33, K), ValueError, "fn must have between 1 and 32 rows"),
    ("fn", torch.ones(MIX, K + 64), ValueError, "fn must have x's 512 columns"),
    ("fn", torch.ones(K, MIX).t(), ValueError, "fn must be contiguous"),
    ("n_splits", 2.0, TypeError, "n_splits must be an int"),
    ("n_splits", 0, ValueError, "n_splits"),
    ("n_splits", 3, ValueError, "n_splits must split K = 512"),
    ("n_splits", 16, ValueError, "n_splits must split K = 512"),
    ("out_mul_splitted", torch.ones(1, T, MIX), ValueError, "out_mul_splitted must have shape"),
    ("out_mul_splitted", torch.ones(2, T, MIX, dtype=torch.float64), TypeError, "out_mul_splitted must be"),
    ("out_mul_splitted", torch.ones(2, MIX, T).transpose(1, 2), ValueError, "out_mul_splitted must be contiguous"),
    ("sqrsum_splitted", torch.ones(2, T + 1), ValueError, "sqrsum_splitted must have shape"),
    ("sqrsum_splitted", torch.ones(2, T, dtype=torch.bfloat16), TypeError, "sqrsum_splitted must be"),
]


@pytest.mark.parametrize(("name", "value", "error", "message"), FORWARD_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(FORWARD_CASES)])
def test_forward_rejects(name, value, error, message):
    args = forward_args()
    outputs = (args["out_mul_splitted"], args["sqrsum_splitted"])
    args[name] = value
    with pytest.raises(error, match=message):
        mhc_pre_norm_fn_gemm_fwd(**args, target="cpu")
    assert all((t == 7.0).all() for t in outputs), "an output was written"


def test_forward_rejects_overlapping_outputs():
    args = forward_args()
    storage = torch.zeros(2 * T * MIX + 2 * T)
    args["out_mul_splitted"] = storage[:2 * T * MIX].view(2, T, MIX)
    args["sqrsum_splitted"] = storage[2 * T * MIX - 1:2 * T * MIX - 1 + 2 * T].view(2, T)
    with pytest.raises(ValueError, match="shares memory"):
        mhc_pre_norm_fn_gemm_fwd(**args, target="cpu")
    args = forward_args()
    fn_storage = torch.zeros(MIX * K + 2 * T * MIX)
    args["fn"] = fn_storage[:MIX * K].view(MIX, K)
    args["out_mul_splitted"] = fn_storage[MIX * K - 1:MIX * K - 1 + 2 * T * MIX].view(2, T, MIX)
    with pytest.raises(ValueError, match="out_mul_splitted shares memory with fn"):
        mhc_pre_norm_fn_gemm_fwd(**args, target="cpu")


BACKWARD_CASES = [
    ("out_mul_grad", torch.ones(T, MIX + 1), ValueError, "out_mul_grad must have shape"),
    ("out_mul_grad", torch.ones(T, MIX, dtype=torch.bfloat16), TypeError, "out_mul_grad must be torch.float32"),
    ("sqrsum_grad", torch.ones(T, 2), ValueError, "sqrsum_grad must have shape"),
    ("sqrsum_grad", torch.ones(T, dtype=torch.float64), TypeError, "sqrsum_grad must be torch.float32"),
    ("x", torch.ones(T, K), TypeError, "x must be torch.bfloat16"),
    ("x", torch.ones(T, K - 256, dtype=torch.bfloat16), ValueError, "fn must have x's 256 columns"),
    ("fn", torch.ones(MIX, K, dtype=torch.bfloat16), TypeError, "fn must be torch.float32"),
    ("x_grad", torch.ones(T, K), TypeError, "x_grad must be torch.bfloat16"),
    ("x_grad", torch.ones(T + 1, K, dtype=torch.bfloat16), ValueError, "x_grad must have shape"),
    ("x_grad", torch.ones(K, T, dtype=torch.bfloat16).t(), ValueError, "x_grad must be contiguous"),
    ("fn_grad", torch.ones(MIX, K, dtype=torch.bfloat16), TypeError, "fn_grad must be"),
    ("fn_grad", torch.ones(MIX - 1, K), ValueError, "fn_grad must have shape"),
]


def _check_untouched(args: dict) -> None:
    assert (args["x_grad"] == 7.0).all() and (args["fn_grad"] == 7.0).all(), "a buffer was written"


@pytest.mark.parametrize(("name", "value", "error", "message"), BACKWARD_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BACKWARD_CASES)])
def test_backward_rejects(name, value, error, message):
    args = backward_args()
    buffers = {"x_grad": args["x_grad"], "fn_grad": args["fn_grad"]}
    args[name] = value
    with pytest.raises(error, match=message):
        mhc_pre_norm_fn_gemm_bwd(**args, target="cpu")
    _check_untouched(buffers)


def test_backward_needs_whole_column_blocks():
    # K = 4·96: the forward takes it (6 slices of 64), the backward's 256-column blocks do not.
    args = backward_args()
    hidden = 384
    args.update(x=torch.ones(T, hidden, dtype=torch.bfloat16), fn=torch.ones(MIX, hidden),
                x_grad=torch.full((T, hidden), 7.0, dtype=torch.bfloat16), fn_grad=torch.full((MIX, hidden), 7.0))
    with pytest.raises(ValueError, match="multiple of 256"):
        mhc_pre_norm_fn_gemm_bwd(**args, target="cpu")
    _check_untouched(args)


def test_backward_rejects_overlaps():
    args = backward_args()
    args["x_grad"] = args["x"]
    with pytest.raises(ValueError, match="x_grad shares memory with x"):
        mhc_pre_norm_fn_gemm_bwd(**args, target="cpu")
    args = backward_args()
    args["fn_grad"] = args["fn"]
    with pytest.raises(ValueError, match="fn_grad shares memory with fn"):
        mhc_pre_norm_fn_gemm_bwd(**args, target="cpu")
    args = backward_args()
    storage = torch.zeros(MIX * K + T * K // 2)
    args["fn_grad"] = storage[:MIX * K].view(MIX, K)
    args["x_grad"] = storage[MIX * K - 8:MIX * K - 8 + T * K // 2].view(torch.bfloat16).view(T, K)
    with pytest.raises(ValueError, match="shares memory"):
        mhc_pre_norm_fn_gemm_bwd(**args, target="cpu")


def test_backward_refuses_a_buffer_that_requires_grad():
    args = backward_args()
    args["x_grad"] = args["x_grad"].float().requires_grad_().to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="x_grad"):
        mhc_pre_norm_fn_gemm_bwd(**args, target="cpu")


@pytest.mark.parametrize("target", ["npu", 3])
def test_bad_target(target):
    error = TypeError if not isinstance(target, str) else ValueError
    with pytest.raises(error, match="target"):
        mhc_pre_norm_fn_gemm_fwd(**forward_args(), target=target)


def test_cuda_target_needs_cuda_tensors():
    with pytest.raises(ValueError, match="cuda"):
        mhc_pre_norm_fn_gemm_fwd(**forward_args(), target="cuda")
    args = backward_args()
    with pytest.raises(ValueError, match="cuda"):
        mhc_pre_norm_fn_gemm_bwd(**args, target="cuda")
    _check_untouched(args)


def test_bad_flavor():
    with pytest.raises(ValueError, match="flavor"):
        mhc_pre_norm_fn_gemm_fwd(**forward_args(), target="cpu", flavor="tpu")
