"""The base of every profile model: unknown keys are refused, values are frozen, numbers are finite.

The modules that define the models evaluate their annotations when the class is made, without
`from __future__ import annotations`: with postponed annotations pydantic gets each field's type as text and
compiles and evaluates it (a `typing.ForwardRef` per field): 16M instructions, 1.2% of a one-request batch
run (docs/speed-log.md, "Start-up").
"""

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # allow_inf_nan=False: YAML reads `.inf` and `.nan` as floats, and no profile or calibration number means
    # anything infinite (an infinite empirical weight made every probability NaN and the run a traceback).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
