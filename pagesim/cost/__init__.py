"""Step-time models: what one engine step costs, in seconds.

`BatchShape` summarises a `SchedulerOutput`; a `CostModel` turns it into seconds. Two models:
`AnalyticalCostModel` (a roofline from the model's and the GPU's specs, the default when no
measurement exists) and `CalibratedCostModel` (interpolates a measured calibration `Profile`).
Imports numpy and pagesim's first row only: never simpy, torch, `sim` or `gpu`.
"""

from pagesim.cost.analytical import AnalyticalConstants, AnalyticalCostModel
from pagesim.cost.base import BatchShape, CostModel
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.fit import FitReport, FitRow, fit_report
from pagesim.cost.profile import (
    PROFILE_FORMAT_VERSION,
    AllReduceRow,
    DecodeRow,
    MixedRow,
    OverheadRow,
    PrefillRow,
    Profile,
    ProfileError,
    ProfileMetadata,
    profile_dir,
)

__all__ = [
    "PROFILE_FORMAT_VERSION",
    "AllReduceRow",
    "AnalyticalConstants",
    "AnalyticalCostModel",
    "BatchShape",
    "CalibratedCostModel",
    "CostModel",
    "DecodeRow",
    "FitReport",
    "FitRow",
    "MixedRow",
    "OverheadRow",
    "PrefillRow",
    "Profile",
    "ProfileError",
    "ProfileMetadata",
    "fit_report",
    "profile_dir",
]
