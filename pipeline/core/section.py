"""The base of every config section, the backends' own included: unknown keys, inf/nan and
a bool where a number belongs are refused when the config loads."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def numbers_only(annotation: Any) -> bool:
    """Whether a field's type takes numbers (int or float) but not a bool."""
    found: set[Any] = set()

    def walk(t: Any) -> None:
        args = get_args(t)
        if args and get_origin(t) in (Union, UnionType, Annotated):
            for a in args:
                walk(a)
        else:
            found.add(t)

    walk(annotation)
    return bool(found & {int, float}) and bool not in found and Any not in found


class Section(BaseModel):
    # inf and nan are never a setting: `timeout_s: .inf` made every request fail with an
    # OverflowError far from the field that caused it
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1 for an int field: `run.budget.requests=true` became a
        # budget of one request. A number field takes numbers only.
        if isinstance(v, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and numbers_only(field.annotation):
                raise ValueError(f"must be a number, not {str(v).lower()}")
        return v
