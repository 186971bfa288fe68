"""mhc_multilayer_recompute: bad input raises a clear TypeError/ValueError naming the argument (a
list element by its index) before any kernel runs, and no output is touched."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_mhc.ops.multilayer_recompute import mhc_multilayer_recompute, mhc_multilayer_recompute_parallel

T, N, H, L = 6, 4, 128, 3
BF16 = torch.bfloat16


def _args(layers=L, post_layers=L - 1, n=N, hidden=H):
    return {
        "initial_residual": torch.ones(T, n, hidden, dtype=BF16),
        "pre_mix_list": [torch.ones(T, n, 1) for _ in range(layers)],
        "layer_output_list": [torch.ones(T, hidden, dtype=BF16) for _ in range(post_layers)],
        "post_mix_list": [torch.ones(T, n) for _ in range(post_layers)],
        "comb_mix_list": [torch.ones(T, n, n) for _ in range(post_layers)],
        "layer_input_list": [torch.zeros(T, hidden, dtype=BF16) for _ in range(layers)],
        "residual_list": [torch.zeros(T, n, hidden, dtype=BF16) for _ in range(post_layers)],
    }


no_kernel = no_kernel_fixture("vmi_mhc.kernels.multilayer_recompute", "vmi_mhc.kernels.pre_apply_mix")


def _item(name, layer, value):
    def change(args):
        args[name][layer] = value
    return change


def _set(name, value):
    def change(args):
        args[name] = value
    return change


BAD = [
    (_set("initial_residual", torch.ones(T, N, H)), TypeError, "initial_residual must be torch.bfloat16"),
    (_set("initial_residual", "R"), TypeError, "initial_residual must be a torch.Tensor"),
    (_set("initial_residual", torch.ones(H, dtype=BF16)), ValueError, r"initial_residual must be \(\.\.\., n, H\)"),
    (_set("initial_residual", torch.ones(T, N, 2 * H, dtype=BF16)[..., ::2]), ValueError,
     "initial_residual must be contiguous"),
    (_set("initial_residual", torch.ones(T, N, 0, dtype=BF16)), ValueError, "hidden size of at least 1"),
    (_set("initial_residual", torch.ones(T, 9, H, dtype=BF16)), ValueError,
     r"initial_residual.size\(-2\) \(the stream count n\) must be in \[1, 8\], got 9"),
    (_set("pre_mix_list", torch.ones(L, T, N)), TypeError, "pre_mix_list must be a list of torch.Tensors"),
    (_set("residual_list", [torch.zeros(T, N, H, dtype=BF16), "R"]), TypeError,
     r"residual_list\[1\] must be a torch.Tensor, got str"),
    (_item("pre_mix_list", 1, torch.ones(T, N, 1, dtype=torch.float64)), TypeError,
     r"pre_mix_list\[1\] must be torch.float32"),
    (_item("pre_mix_list", 2, torch.ones(T, N, 2)), ValueError,
     r"pre_mix_list\[2\] must have shape \(6, 4, 1\) or \(6, 4\), got \(6, 4, 2\)"),
    (_item("pre_mix_list", 0, torch.ones(T, N, 2)[..., :1]), ValueError, r"pre_mix_list\[0\] must be contiguous"),
    (_item("pre_mix_list", 0, torch.ones(T, N, device="meta")), ValueError, r"pre_mix_list\[0\] must be on cpu"),
    (_item("layer_output_list", 1, torch.ones(T, H)), TypeError, r"layer_output_list\[1\] must be torch.bfloat16"),
    (_item("layer_output_list", 0, torch.ones(T, H + 1, dtype=BF16)), ValueError,
     r"layer_output_list\[0\] must have shape \(6, 128\)"),
    (_item("post_mix_list", 0, torch.ones(T, N, N)), ValueError, r"post_mix_list\[0\] must have shape"),
    (_item("comb_mix_list", 1, torch.ones(T, N, N).transpose(1, 2)), ValueError,
     r"comb_mix_list\[1\] must be contiguous"),
    (_item("comb_mix_list", 0, torch.ones(T, N, N, dtype=BF16)), TypeError,
     r"comb_mix_list\[0\] must be torch.float32"),
    (_item("layer_input_list", 2, torch.zeros(T, H)), TypeError, r"layer_input_list\[2\] must be torch.bfloat16"),
    (_item("layer_input_list", 0, torch.zeros(T + 1, H, dtype=BF16)), ValueError,
     r"layer_input_list\[0\] must have shape \(6, 128\)"),
    (_item("residual_list", 1, torch.zeros(T, N, H, dtype=BF16).transpose(0, 1).contiguous().transpose(0, 1)),
     ValueError, r"residual_list\[1\] must be contiguous"),
    (_item("residual_list", 0, torch.zeros(T, N, H, dtype=BF16, device="meta")), ValueError,
     r"residual_list\[0\] must be on cpu"),
    (_set("target", "cuda"), ValueError, "target 'cuda'"),
    (_set("target", 3), TypeError, "target must be a str or None"),
    (_set("flavor", "rocm"), ValueError, "flavor must be one of"),
    (lambda args: args.update(target="ascend-sim", flavor="cuda"), ValueError, "flavor"),
]


def _outputs(args):
    return [t for t in args["layer_input_list"] + args["residual_list"] if isinstance(t, torch.Tensor)
            and t.device.type == "cpu"]


@pytest.mark.parametrize("change,error,match", BAD)
def test_bad_arguments(change, error, match):
    args = _args()
    change(args)
    before = [t.clone() for t in _outputs(args)]
    with pytest.raises(error, match=match):
        mhc_multilayer_recompute(**args)
    assert all(torch.equal(a, b) for a, b in zip(_outputs(args), before, strict=True))


@pytest.mark.parametrize("layers,post_layers,match", [
    (0, 0, "pre_mix_list must hold between 1 and 16 tensors"),
    (17, 17, "pre_mix_list must hold between 1 and 16 tensors"),
    (3, 1, "layer_output_list must hold num_layers - 1 or num_layers tensors"),
    (2, 3, "layer_output_list must hold num_layers - 1 or num_layers tensors"),
])
def test_bad_layer_counts(layers, post_layers, match):
    with pytest.raises(ValueError, match=match):
        mhc_multilayer_recompute(**_args(layers, post_layers, hidden=8))


@pytest.mark.parametrize("name,match", [
    ("layer_input_list", r"layer_input_list must hold one tensor per layer like pre_mix_list \(3\), got 2"),
    ("post_mix_list", r"post_mix_list must hold one tensor per post layer like layer_output_list \(2\), got 1"),
    ("comb_mix_list", r"comb_mix_list must hold one tensor per post layer"),
    ("residual_list", r"residual_list must hold one tensor per post layer"),
])
def test_list_lengths_must_agree(name, match):
    args = _args()
    args[name] = args[name][1:]
    with pytest.raises(ValueError, match=match):
        mhc_multilayer_recompute(**args)


@pytest.mark.parametrize("name,layer,alias,match", [
    ("layer_input_list", 1, lambda args: args["layer_output_list"][0],
     r"layer_input_list\[1\] shares memory with layer_output_list\[0\]"),
    ("residual_list", 0, lambda args: args["initial_residual"],
     r"residual_list\[0\] shares memory with initial_residual"),
    ("residual_list", 1, lambda args: args["residual_list"][0],
     r"residual_list\[0\] shares memory with residual_list\[1\]"),
])
def test_outputs_overlapping_inputs_or_each_other_are_refused(name, layer, alias, match):
    args = _args()
    args[name][layer] = alias(args)
    before = [t.clone() for t in args["layer_input_list"] + args["residual_list"]]
    with pytest.raises(ValueError, match=match):
        mhc_multilayer_recompute(**args)
    after = args["layer_input_list"] + args["residual_list"]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_outputs_requiring_grad_are_refused():
    args = _args()
    args["layer_input_list"][0].requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"layer_input_list\[0\]"):
        mhc_multilayer_recompute(**args)


def test_parallel_entry_point_refuses_torch():
    with pytest.raises(ValueError, match="always runs the kernel"):
        mhc_multilayer_recompute_parallel(**_args(), target="torch")
