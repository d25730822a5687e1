"""Building and copying pydantic models on the kernel's hot path, without re-validation.

Only for values the kernel itself computed; anything from outside is validated at the edge.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

# Bound once: these run several times per model built, on every step.
_new = object.__new__
_set = object.__setattr__


def shallow_copy(model: M) -> M:
    """A shallow copy of a pydantic model without re-validation (``model_copy`` minus its
    overhead, which shows on the kernel's hot path)."""
    new = _new(model.__class__)
    _set(new, "__dict__", model.__dict__.copy())
    _set(new, "__pydantic_fields_set__", model.__pydantic_fields_set__)
    _set(new, "__pydantic_extra__", None)
    _set(new, "__pydantic_private__", None)
    return new


_TEMPLATES: dict[type[BaseModel], dict[str, Any]] = {}


def construct(cls: type[M], **values: Any) -> M:
    """Build a model from values the kernel computed itself, without validation.

    Like ``model_construct`` but with the defaults looked up once per class; only for models
    whose defaults are immutable (the kernel's rows, operations and commands). The fields
    keep their declared order, so the model serialises exactly as a validated one does.
    """
    template = _TEMPLATES.get(cls)
    if template is None:
        template = {
            name: None if f.is_required() else f.get_default(call_default_factory=True)
            for name, f in cls.model_fields.items()
        }
        _TEMPLATES[cls] = template
    fields = template.copy()
    fields.update(values)  # an update keeps the template's (declared) order
    new = _new(cls)
    _set(new, "__dict__", fields)
    _set(new, "__pydantic_fields_set__", set(values))
    _set(new, "__pydantic_extra__", None)
    _set(new, "__pydantic_private__", None)
    return new
