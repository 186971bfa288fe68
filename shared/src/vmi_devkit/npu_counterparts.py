"""torch_npu's fused ops beside the vmi ops they stand in for, for ``scripts/npu-check``'s bench stage.

Each entry calls the fused op a user of torch_npu would call instead of the vmi op, on the vmi op's
own inputs. None computes exactly what the vmi op does (the differences are in ``COUNTERPARTS``), so
the comparison is of speed, never of results. Signatures: Ascend op-plugin's
``op_plugin_functions.yaml`` and torch_npu's API pages (``npu_dynamic_quant``'s fp8 output is
documented for the Ascend 950 only).
"""

from __future__ import annotations

import torch

# op -> (the fused call, what differs from the vmi op, the call on the op's inputs)
COUNTERPARTS = {
    "per_token_cast": ("npu_dynamic_quant(x, dst_type=float8_e4m3fn)",
                       "one scale per row where vmi has one per 32 channels",
                       lambda npu, i: npu.npu_dynamic_quant(i["x"], dst_type=torch.float8_e4m3fn)),
    "norm_forward": ("npu_rms_norm(x, weight)", "bf16 output with the rstd, no cast",
                     lambda npu, i: npu.npu_rms_norm(i["x"], i["weight"])),
    "swiglu_forward": ("npu_swiglu(x)", "no per-expert layout, weights or clamp",
                       lambda npu, i: npu.npu_swiglu(i["x"])),
    "moe_topk_gate": ("npu_moe_gating_top_k(logits, k, bias=bias, norm_type=1)",
                      "sigmoid scores where vmi's gate takes sqrt(softplus); no mask",
                      lambda npu, i: npu.npu_moe_gating_top_k(i["logits"], 8, bias=i["bias"], norm_type=1)),
}


def time_counterparts(ops: list[str] | None, quick: bool, repeat: int) -> list[dict]:
    """Each counterpart at its op's bench shapes (the first only with ``quick``): median µs per call on
    NPU events, and GB/s of the tensors it reads and writes."""
    import torch_npu

    from vmi_core.tools.devicecheck import call_time, to_device
    from vmi_core.tools.registry import discover, tensor_bytes

    installed = discover()
    rows = []
    for name, (call, differs, fn) in COUNTERPARTS.items():
        if name not in installed or (ops and name not in ops):
            continue
        op = installed[name]
        options = {o.name: o.default for o in op.options}
        for shape in op.bench_shapes[:1] if quick else op.bench_shapes:
            row = {"op": name, "counterpart": call, "differs": differs, "shape": "x".join(map(str, shape))}
            try:
                inputs = to_device(op.make_inputs(shape, options, 0), "npu")
                outputs = fn(torch_npu, inputs)
                seconds = call_time(lambda fn=fn, inputs=inputs: fn(torch_npu, inputs), repeat, "npu")
                nbytes = tensor_bytes(inputs) + tensor_bytes(outputs)
                row.update(us=seconds * 1e6, gbs=nbytes / seconds / 1e9)
            except Exception as error:  # noqa: BLE001 (an unsupported call is a finding)
                row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]
            rows.append(row)
    return rows
