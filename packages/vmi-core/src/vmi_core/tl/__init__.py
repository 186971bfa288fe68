"""TileLang-side building blocks: the kernel shell and kernel macros (formats, SR, reductions), and
TileLang itself, imported at the first kernel build (``lazy``)."""
