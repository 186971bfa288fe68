"""vmi-mhc's ops, one module each: the public function, its validation and its declaration
(``vmi_core.library.KernelOp``); the op's kernel is the module of the same name in ``kernels/``, its
reference in ``reference/``."""
