"""Building and copying pydantic models on the kernel's hot path, without re-validation.

Only for values the kernel itself computed; anything from outside is validated at the edge.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


def shallow_copy(model: M) -> M:
    """A shallow copy of a pydantic model without re-validation (``model_copy`` minus its
    overhead, which shows on the kernel's hot path)."""
    cls = model.__class__
    new = cls.__new__(cls)
    object.__setattr__(new, "__dict__", model.__dict__.copy())
    object.__setattr__(new, "__pydantic_fields_set__", model.__pydantic_fields_set__)
    object.__setattr__(new, "__pydantic_extra__", None)
    object.__setattr__(new, "__pydantic_private__", None)
    return new


_DEFAULTS: dict[type[BaseModel], dict[str, Any]] = {}


def construct(cls: type[M], **values: Any) -> M:
    """Build a model from values the kernel computed itself, without validation.

    Like ``model_construct`` but with the defaults looked up once per class; only for models
    whose defaults are immutable (the kernel's rows and operations).
    """
    defaults = _DEFAULTS.get(cls)
    if defaults is None:
        defaults = {
            name: f.get_default(call_default_factory=True)
            for name, f in cls.model_fields.items()
            if not f.is_required()
        }
        _DEFAULTS[cls] = defaults
    new = cls.__new__(cls)
    object.__setattr__(new, "__dict__", {**defaults, **values})
    object.__setattr__(new, "__pydantic_fields_set__", set(values))
    object.__setattr__(new, "__pydantic_extra__", None)
    object.__setattr__(new, "__pydantic_private__", None)
    return new
