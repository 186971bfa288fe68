"""TileLang-side building blocks: the kernel shell and kernel macros (formats, SR, reductions)."""
