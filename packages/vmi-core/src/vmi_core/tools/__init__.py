"""vmi-core's tools, apart from the runtime the kernels use: the ``vmi`` command (``cli``, ``registry``,
``bench``, ``plot``, ``precompile``, ``cache``), the GPU check (``devicecheck``) and the test helpers
(``testing``, ``source_checks``)."""
