"""What a run costs: its seconds x the GPUs it holds x a price per GPU-hour that the user gives (a lease's price is
theirs to know). One formula (``cost_usd``) for ``plan --time``, ``compare`` and 04.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PRICE_FLAG = "--usd-per-gpu-hour"
SECONDS_PER_HOUR = 3600.0
MAX_USD_PER_GPU_HOUR = 1_000_000.0
"""A typo guard, not a price: beyond this a number is a mistake (1e308 would make every cost ``inf``)."""


def checked_price(value: Any, *, source: str = PRICE_FLAG) -> float:
    """A string is read as a number; anything not finite and > 0 is a one-line ValueError naming ``source``."""
    try:
        price = float(value)
    except (TypeError, ValueError, OverflowError):
        price = math.nan
    if isinstance(value, bool) or not 0 < price <= MAX_USD_PER_GPU_HOUR:  # NaN fails the comparison too
        raise ValueError(
            f"{source} must be your lease's price of one GPU for one hour in US dollars, a number above 0 and at "
            f"most {MAX_USD_PER_GPU_HOUR:,.0f}; got {value!r}"
        )
    return price


def gpu_hours(seconds: float, gpus: int) -> float:
    return seconds * gpus / SECONDS_PER_HOUR


def cost_usd(seconds: float, gpus: int, usd_per_gpu_hour: float) -> float:
    return gpu_hours(seconds, gpus) * usd_per_gpu_hour


def usd_text(usd: float) -> str:
    """Two significant digits below a dollar: a CPU run costs a fraction of a cent."""
    return f"${usd:,.2f}" if usd >= 1 else f"${usd:.2g}"


@dataclass(frozen=True)
class RunCost:
    """``what`` says which seconds."""

    seconds: float
    gpus: int
    what: str
    usd_per_gpu_hour: float | None = None

    @property
    def gpu_hours(self) -> float:
        return gpu_hours(self.seconds, self.gpus)

    @property
    def usd(self) -> float | None:
        return None if self.usd_per_gpu_hour is None else cost_usd(self.seconds, self.gpus, self.usd_per_gpu_hour)

    def words(self) -> str:
        """'10.2 s x 1 GPU(s) = 0.0028 GPU-hours x $P per GPU-hour = $C (what)'; without a price, the GPU-hours."""
        text = f"{self.seconds:,.1f} s x {self.gpus} GPU(s) = {self.gpu_hours:.2g} GPU-hours"
        if self.usd is not None:
            text += f" x ${self.usd_per_gpu_hour:g} per GPU-hour = {usd_text(self.usd)}"
        return f"{text} ({self.what})"

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "gpus": self.gpus, "gpu_hours": self.gpu_hours,
                "usd_per_gpu_hour": self.usd_per_gpu_hour, "cost_usd": self.usd, "what": self.what}  # fmt: skip
