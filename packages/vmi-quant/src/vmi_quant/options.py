"""Option objects the quantization ops carry from their entry point to the kernel spec and the reference.

An op's flags are validated once, when its options object is built, and then travel as one
frozen value (``_prepare(options, ...)``, ``make_spec(..., options, ...)``, the call's
``options``) instead of a train of positional booleans.
"""

from __future__ import annotations

from dataclasses import dataclass

from vmi_core.targets import Flavor

from .inputs import check_sf_options
from .sf_layout import SFLayout


@dataclass(frozen=True)
class SFOptions:
    """How an op stores the scaling factors it computes (TileKernels' four SF flags).

    Validated on construction: each flag is a bool, ``use_packed_ue8m0`` needs ``round_sf``,
    and ``round_sf`` excludes ``use_e4m3_sf`` (TypeError / ValueError as ``check_sf_options``).
    """

    use_tma_aligned_col_major_sf: bool = False
    round_sf: bool = False
    use_packed_ue8m0: bool = False
    use_e4m3_sf: bool = False

    def __post_init__(self) -> None:
        check_sf_options(self.round_sf, self.use_packed_ue8m0, self.use_e4m3_sf)
        if not isinstance(self.use_tma_aligned_col_major_sf, bool):
            raise TypeError("use_tma_aligned_col_major_sf must be a bool")

    def layout(self, flavor: Flavor, block_k: int = 0) -> SFLayout:
        """The SF layout these flags give for ``flavor`` (packing along M iff ``block_k == 1``)."""
        return SFLayout.of(flavor, packed=self.use_packed_ue8m0, e4m3=self.use_e4m3_sf,
                           col_major=self.use_tma_aligned_col_major_sf, block_k=block_k)

    def as_kwargs(self) -> dict[str, bool]:
        """The four flags as keyword arguments (of the reference, or a public function)."""
        return {"use_tma_aligned_col_major_sf": self.use_tma_aligned_col_major_sf, "round_sf": self.round_sf,
                "use_packed_ue8m0": self.use_packed_ue8m0, "use_e4m3_sf": self.use_e4m3_sf}
