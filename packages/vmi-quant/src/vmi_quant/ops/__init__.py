"""vmi-quant's ops, one module each: the public function, its validation and its declaration
(``vmi_core.library.KernelOp`` with the ``vmi`` command's ``Command``); the op's kernel is the module
of the same name in ``kernels/``, its reference in ``reference/``. ``demo`` holds the command's inputs
and sizes that several ops share."""
