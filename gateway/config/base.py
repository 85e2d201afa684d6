"""The base of every config table: unknown keys are errors, values never change once loaded."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["_Model"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
