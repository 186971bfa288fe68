"""Kernel-side formulations shared by the unfused mHC kernels and the fused ones
(``pre_big_fuse``, ``multilayer_recompute``): each per-flavor arithmetic chain lives in one
place so that the fused kernels reproduce the unfused ones bit for bit."""
