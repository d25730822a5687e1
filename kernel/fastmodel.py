"""Building and copying pydantic models on the kernel's hot path, without re-validation.

Only for values the kernel itself computed; anything from outside is validated at the edge.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)
E = TypeVar("E", bound=type[Enum])

# Bound once: these run several times per model built, on every step. A model's state lives
# in the four slots BaseModel declares; their descriptors set them more cheaply than
# ``object.__setattr__`` (which builds two argument tuples per call).
_new = object.__new__
_slot = BaseModel.__dict__
_set_dict = _slot["__dict__"].__set__
_set_fields_set = _slot["__pydantic_fields_set__"].__set__
_set_extra = _slot["__pydantic_extra__"].__set__
_set_private = _slot["__pydantic_private__"].__set__


def shallow_copy(model: M) -> M:
    """A shallow copy of a pydantic model without re-validation (``model_copy`` minus its
    overhead, which shows on the kernel's hot path)."""
    new = _new(type(model))
    _set_dict(new, model.__dict__.copy())
    _set_fields_set(new, model.__pydantic_fields_set__)
    _set_extra(new, None)
    _set_private(new, None)
    return new


class Mutable(BaseModel):
    """Base of the models the kernel changes in place, always on its own copy of a record.

    Assigning a field writes it straight into the instance: these models validate nothing on
    assignment, and pydantic's general ``__setattr__`` (handlers, frozen checks, the set of
    fields set, which nothing here reads) shows on the kernel's most frequent writes. Any
    other name goes through pydantic as before, so a name that is not a field still fails.
    """

    if not TYPE_CHECKING:  # mypy keeps checking assignments against the declared fields

        def __setattr__(self, name: str, value: Any) -> None:
            fields = self.__dict__  # every field is a key of it, and nothing else is
            if name in fields:
                fields[name] = value
            else:
                super().__setattr__(name, value)


_Factory = Callable[[], Any]
_TEMPLATES: dict[type[BaseModel], tuple[dict[str, Any], tuple[tuple[str, _Factory], ...]]] = {}


def _template(cls: type[BaseModel]) -> tuple[dict[str, Any], tuple[tuple[str, _Factory], ...]]:
    """Every field in declared order with its plain default (None where it has none, or a
    factory), and the fields whose default comes from a factory."""
    fields: dict[str, Any] = {}
    factories: list[tuple[str, _Factory]] = []
    for name, f in cls.model_fields.items():
        fields[name] = None if f.is_required() or f.default_factory else f.default
        factory = f.default_factory
        if isinstance(factory, type) and issubclass(factory, BaseModel):
            # A model of its defaults: built the same way, not validated again.
            factories.append((name, partial(construct, factory)))
        elif factory is not None:
            factories.append((name, cast(_Factory, factory)))
    return fields, tuple(factories)


def construct(cls: type[M], **values: Any) -> M:
    """Build a model from values the kernel computed itself, without validation.

    Like ``model_construct`` but with the defaults looked up once per class. A field left out
    gets its default; one with a default factory gets a fresh value from it, as validation
    would give (a list or dict of its own, never one shared with another model). The fields
    keep their declared order, so the model serialises exactly as a validated one does.
    """
    found = _TEMPLATES.get(cls)
    if found is None:
        found = _TEMPLATES[cls] = _template(cls)
    template, factories = found
    fields = {**template, **values}  # the template's keys first: the declared order
    if factories:
        for name, factory in factories:
            if name not in values:
                fields[name] = factory()
    new = _new(cls)
    _set_dict(new, fields)
    _set_fields_set(new, set(values))
    _set_extra(new, None)
    _set_private(new, None)
    return new


class _PinnedValue:
    """A non-data descriptor for ``value``: the member's own attribute wins over it."""

    def __get__(self, member: Enum | None, owner: type[Enum] | None = None) -> Any:
        return self if member is None else member._value_


def pinned_values(cls: E) -> E:
    """Make ``member.value`` a plain attribute read for every member of ``cls``.

    pydantic serialises an enum field by reading the member's ``value``, and the kernel reads
    it too; ``Enum.value`` is a Python-level property (two calls per read), which shows on
    records serialised after every step. Each member keeps its value in its ``__dict__``, so
    the read happens in C; the value itself, equality, hashing and pickling are unchanged.
    """
    type.__setattr__(cls, "value", _PinnedValue())  # shadows Enum's data descriptor
    for member in cls:
        member.__dict__["value"] = member._value_
    return cls
