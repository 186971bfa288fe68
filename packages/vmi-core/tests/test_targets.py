"""Target and flavor resolution (vmi_core.targets)."""

from __future__ import annotations

import pytest
import torch

from vmi_core import refresh_environment
from vmi_core.targets import (
    ASCEND,
    CUDA,
    FLAVOR_ENV,
    TARGET_ENV,
    Flavor,
    get_flavor,
    require_kernel,
    resolve_flavor,
    resolve_target,
    target_of_device,
)


@pytest.fixture(autouse=True)
def _clean_env(vmi_env):
    vmi_env.delenv(TARGET_ENV, raising=False)
    vmi_env.delenv(FLAVOR_ENV, raising=False)


CPU_TENSOR = torch.zeros(2)


class TestResolveTarget:
    def test_device_default(self):
        assert resolve_target(CPU_TENSOR) == "cpu"

    def test_argument(self):
        assert resolve_target(CPU_TENSOR, "cpu") == "cpu"
        assert resolve_target(CPU_TENSOR, "torch") == "torch"

    def test_env(self, vmi_env):
        vmi_env.setenv(TARGET_ENV, "torch")
        assert resolve_target(CPU_TENSOR) == "torch"
        vmi_env.setenv(TARGET_ENV, "cpu")
        assert resolve_target(CPU_TENSOR) == "cpu"

    def test_argument_beats_env(self, vmi_env):
        vmi_env.setenv(TARGET_ENV, "torch")
        assert resolve_target(CPU_TENSOR, "cpu") == "cpu"

    def test_env_is_read_once_until_refreshed(self, monkeypatch):
        # The autouse _clean_env's vmi_env, set up before this monkeypatch, refreshes after it restores.
        monkeypatch.setenv(TARGET_ENV, "torch")
        monkeypatch.setenv(FLAVOR_ENV, "cuda")
        assert (resolve_target(CPU_TENSOR), resolve_flavor("cpu")) == ("cpu", ASCEND)
        refresh_environment()
        assert (resolve_target(CPU_TENSOR), resolve_flavor("cpu")) == ("torch", CUDA)

    def test_empty_env_means_unset(self, vmi_env):
        vmi_env.setenv(TARGET_ENV, "")
        assert resolve_target(CPU_TENSOR) == "cpu"

    # ``name``, not ``target``: a ``target`` parameter says where a test runs kernels (vmi-devkit's plugin).
    @pytest.mark.parametrize("name,device", [("cuda", "'cuda'"), ("ascend", "'npu'")])
    def test_device_mismatch_names_target(self, name, device):
        message = f"target '{name}' runs on {device} tensors, but the input is on 'cpu'"
        with pytest.raises(ValueError, match=message):
            resolve_target(CPU_TENSOR, name)

    def test_env_mismatch_names_target(self, vmi_env):
        vmi_env.setenv(TARGET_ENV, "ascend")
        with pytest.raises(ValueError, match="target 'ascend'"):
            resolve_target(CPU_TENSOR)

    @pytest.mark.parametrize("bad", ["rocm", "CPU", "c"])
    def test_unknown_target(self, bad, vmi_env):
        with pytest.raises(ValueError, match=f"got '{bad}'"):
            resolve_target(CPU_TENSOR, bad)
        vmi_env.setenv(TARGET_ENV, bad)
        with pytest.raises(ValueError, match=f"got '{bad}'"):
            resolve_target(CPU_TENSOR)

    def test_meta_tensors_take_any_target(self):
        # Meta tensors only reach shape functions: any target's layouts, the reference's by default.
        meta = torch.zeros(2, device="meta")
        assert resolve_target(meta) == "torch"
        assert resolve_target(meta, "cuda") == "cuda"
        with pytest.raises(ValueError, match="got 'rocm'"):
            resolve_target(meta, "rocm")

    def test_target_of_device(self):
        assert target_of_device(torch.device("cpu")) == "cpu"
        assert target_of_device(torch.device("cuda")) == "cuda"  # a device object needs no GPU
        with pytest.raises(ValueError, match="'meta'"):
            target_of_device(torch.device("meta"))


class TestResolveFlavor:
    def test_cpu_defaults_to_ascend(self):
        assert resolve_flavor("cpu") is ASCEND
        assert resolve_flavor("torch") is ASCEND

    def test_cpu_env(self, vmi_env):
        vmi_env.setenv(FLAVOR_ENV, "cuda")
        assert resolve_flavor("cpu") is CUDA
        assert resolve_flavor("torch") is CUDA
        assert resolve_flavor("cpu", "ascend") is ASCEND  # the argument wins

    def test_cpu_argument(self):
        assert resolve_flavor("cpu", "cuda") is CUDA
        assert resolve_flavor("cpu", CUDA) is CUDA

    @pytest.mark.parametrize("name,own", [("ascend", ASCEND), ("cuda", CUDA)])
    def test_device_targets_use_their_own(self, name, own, vmi_env):
        assert resolve_flavor(name) is own
        assert resolve_flavor(name, own.name) is own
        assert resolve_flavor(name, own) is own
        other = CUDA if own is ASCEND else ASCEND
        vmi_env.setenv(FLAVOR_ENV, other.name)
        assert resolve_flavor(name) is own  # the environment only applies to cpu/torch
        with pytest.raises(ValueError, match=f"flavor '{other.name}' is not available on target '{name}'"):
            resolve_flavor(name, other.name)

    def test_bad_env_flavor(self, vmi_env):
        vmi_env.setenv(FLAVOR_ENV, "rocm")
        with pytest.raises(ValueError, match="got 'rocm'"):
            resolve_flavor("cpu")

    def test_unknown_target(self):
        with pytest.raises(ValueError, match="got 'rocm'"):
            resolve_flavor("rocm")


class TestFlavor:
    def test_get_flavor(self):
        assert get_flavor("ascend") is ASCEND
        assert get_flavor("cuda") is CUDA
        assert get_flavor(CUDA) is CUDA

    @pytest.mark.parametrize("bad", ["rocm", "Ascend", ""])
    def test_get_flavor_errors(self, bad):
        with pytest.raises(ValueError, match=r"flavor must be one of \('ascend', 'cuda'\)"):
            get_flavor(bad)

    def test_conventions(self):
        assert (ASCEND.ue8m0_pack, ASCEND.ue8m0_word_dtype) == (2, torch.int16)
        assert (CUDA.ue8m0_pack, CUDA.ue8m0_word_dtype) == (4, torch.int32)
        assert ASCEND.dequant_before_scale and not CUDA.dequant_before_scale
        # Column-major storage rows: 16 bytes on CUDA, none on Ascend.
        assert [CUDA.col_major_align(b) for b in (1, 2, 4)] == [16, 8, 4]
        assert [ASCEND.col_major_align(b) for b in (1, 2, 4)] == [1, 1, 1]
        assert isinstance(ASCEND, Flavor)


class TestRequireKernel:
    @pytest.mark.parametrize("x", [CPU_TENSOR, (CPU_TENSOR, CPU_TENSOR)], ids=["tensor", "pair"])
    def test_refuses_the_reference(self, x, vmi_env):
        require_kernel("op_parallel", x, "cpu")
        with pytest.raises(ValueError, match="op_parallel always runs the kernel"):
            require_kernel("op_parallel", x, "torch")
        vmi_env.setenv(TARGET_ENV, "torch")
        with pytest.raises(ValueError, match="op_parallel always runs the kernel"):
            require_kernel("op_parallel", x, None)

    @pytest.mark.parametrize("x", [None, (), [1, 2]])
    def test_without_a_tensor_only_the_asked_reference_is_refused(self, x, vmi_env):
        require_kernel("op_parallel", x, "cpu")
        require_kernel("op_parallel", x, None)
        with pytest.raises(ValueError, match="op_parallel always runs the kernel"):
            require_kernel("op_parallel", x, "torch")
        vmi_env.setenv(TARGET_ENV, "torch")
        with pytest.raises(ValueError, match="op_parallel always runs the kernel"):
            require_kernel("op_parallel", x, None)
