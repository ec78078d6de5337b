"""The base of every profile model: unknown keys are refused, values are frozen, numbers are finite."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # allow_inf_nan=False: YAML reads `.inf` and `.nan` as floats, and no profile or calibration number means
    # anything infinite (an infinite empirical weight made every probability NaN and the run a traceback).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
