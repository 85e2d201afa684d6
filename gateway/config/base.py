"""The base of every config table: unknown keys are errors, values never change once loaded."""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

__all__ = ["AT", "_Model", "located_error"]

#: The context key of a :func:`located_error` that holds the path of the key at fault below the
#: field its validator checks (what load.py adds to the error's location).
AT: Final = "config_at"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def located_error(message: str, *at: str | int) -> PydanticCustomError:
    """An error of a validator that checks a whole table, at the key ``at`` below it
    (``located_error("...", "rules", 0, "claims")`` in ``policy``'s validator: the message names
    ``policy.rules[0].claims``, with its line), in plain words (pydantic would prefix a ValueError's)."""
    return PydanticCustomError("config", message, {AT: at})
