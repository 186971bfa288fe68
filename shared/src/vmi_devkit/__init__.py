"""vmi-devkit: what the tests and tools of every vmi package share and no wheel ships.

* ``vmi_devkit.pytest_plugin``: markers, ``--target``, ``--slow-share``/``--slow-seed`` and the kernel
  cache of every pytest run (entry point group ``pytest11``);
* ``vmi_devkit.strategies``: hypothesis profiles and input strategies of the property tests;
* ``vmi_devkit.cases``: the case tables of the op tests (``ptc_cases``, ``moe_cases``, ...);
* ``vmi_devkit.sim_kernels``: small kernels of vmi-core's ascend-sim and compile tests;
* ``vmi_devkit.cuda``: the lowering tests' nvcc step (skipped where the CUDA toolkit is missing);
* ``vmi_devkit.baselines``: the torch baselines of ``vmi bench`` (entry point group ``vmi.baselines``).
"""
