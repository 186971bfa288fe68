"""vmi: the three op families (``vmi_quant``, ``vmi_mhc``, ``vmi_moe``) at versions tested together,
and the DeepSeek-V4-style block that runs them end to end (``vmi demo``)."""

__version__ = "0.1.0"
