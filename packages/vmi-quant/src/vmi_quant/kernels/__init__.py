"""vmi-quant's TileLang kernels: one module per op, named as its dispatch module in ``ops/``."""
