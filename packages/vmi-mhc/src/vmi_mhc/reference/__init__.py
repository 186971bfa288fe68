"""PyTorch reference (oracle) of the mHC ops."""
