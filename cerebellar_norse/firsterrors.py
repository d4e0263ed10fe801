"""Refusing a request body by its first errors, without building one error per unknown key.

A body is refused with its first error (the HTTP answer names one field). pydantic builds
an error for every unknown key and every bad item, and turning them into Python took the
event loop 0.2 s for a 1 MB tick of 75,000 unknown keys, and 0.4-0.7 s through FastAPI's
routes. pydantic lists a model's errors in a fixed order: its fields' errors in field
order (a list's items in order), then its unknown keys in the body's order. So a body cut
to its known fields, its first unknown key, and each list up to its first bad item (cut
the same way) has the same first error and at most a few more.
"""

from __future__ import annotations

from typing import Any, get_args, get_origin

from annotated_types import MaxLen
from pydantic import BaseModel, ModelWrapValidatorHandler, ValidationError, model_validator
from pydantic.fields import FieldInfo

# past this many errors a refusal's list is not built whole
ERRORS_LISTED = 16


def cut_to_first_error(model: type[BaseModel], data: dict[Any, Any]) -> dict[Any, Any]:
    """``data`` cut so that validating it as ``model`` fails with the same first error as ``data`` does."""
    fields = model.model_fields
    out: dict[Any, Any] = {}
    unknown_kept = False
    for key, value in data.items():
        if key in fields:
            out[key] = _cut_list(fields[key], value)
        elif not unknown_kept:
            out[key], unknown_kept = value, True
    return out


def _cut_list(field: FieldInfo, value: Any) -> Any:
    """A list of a model's items up to its first bad item, itself cut; anything else as it is."""
    item = _item_model(field)
    longest = next((m.max_length for m in field.metadata if isinstance(m, MaxLen)), None)
    if item is None or not isinstance(value, list) or (longest is not None and len(value) > longest):
        return value  # (a list too long is refused as such, one error, its items unread)
    for i, v in enumerate(value):
        try:
            item.model_validate(v)
        except ValidationError:
            return [*value[:i], cut_to_first_error(item, v) if isinstance(v, dict) else v]
    return value


def _item_model(field: FieldInfo) -> type[BaseModel] | None:
    """The model of a ``list[Model]`` field's items, or None."""
    args = get_args(field.annotation)
    if get_origin(field.annotation) is list and len(args) == 1 and isinstance(args[0], type) \
            and issubclass(args[0], BaseModel):
        return args[0]
    return None


class FirstErrorsModel(BaseModel):
    """A request body model whose refusal, past :data:`ERRORS_LISTED` errors, lists its first errors only.

    One Python call per validation: for bodies validated once per request, not for the
    hot path's tick (see ``api.schemas.tick_errors``).
    """

    @model_validator(mode="wrap")
    @classmethod
    def _first_errors_only(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        try:
            return handler(data)
        except ValidationError as exc:
            if exc.error_count() > ERRORS_LISTED and isinstance(data, dict):
                handler(cut_to_first_error(cls, data))  # raises the same first error
            raise
