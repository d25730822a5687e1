"""A model's JSON bytes exactly as its pydantic serializer writes them, written by orjson.

:func:`model_json` returns the bytes ``model.__pydantic_serializer__.to_json(model)`` would;
for a class marked with :func:`json_native` orjson writes them, in C, and wherever the two
could differ (a float field holding an int, a value orjson cannot write or writes otherwise, a
class whose JSON pydantic customises) pydantic writes the value. Not checked, so not to be
relied on: an ``int`` field holding a ``bool``, a marked model inside an ``Any`` field, a
Decimal subclass with its own ``__str__``. Design: docs/adr/0102-model-json-through-orjson.md.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from decimal import Decimal
from typing import Any, TypeGuard, TypeVar, Union, get_args, get_origin

import orjson
from pydantic import BaseModel, PlainSerializer, WrapSerializer

T = TypeVar("T", bound=BaseModel)
Check = Callable[[Any], bool]

_NATIVE = "__dataclass_fields__"  # what orjson looks for in a class's own namespace
_DECIMAL_TEXT = Decimal.__str__  # C-level; refuses anything but a Decimal, so orjson raises


def json_native(cls: type[T]) -> type[T]:
    """Class decorator: orjson writes instances of ``cls`` from their fields, in C.

    Raises ``TypeError`` at class definition for a class whose JSON pydantic customises.
    """
    why = _not_native(cls)
    if why is not None:
        raise TypeError(f"{cls.__name__} cannot be written by orjson: {why}")
    shape = dataclasses.make_dataclass(
        cls.__name__, [(name, info.annotation) for name, info in cls.model_fields.items()]
    )
    type.__setattr__(cls, _NATIVE, vars(shape)[_NATIVE])
    return cls


def _not_native(cls: type[BaseModel]) -> str | None:
    config, decorators = cls.model_config, cls.__pydantic_decorators__
    if _NATIVE in cls.__dict__:
        return "it already has dataclass fields"
    if config.get("extra") == "allow":
        return "it keeps extra fields"
    if config.get("json_encoders") or config.get("ser_json_inf_nan", "null") != "null":
        return "its config changes the JSON"
    if cls.__pydantic_computed_fields__ or decorators.field_serializers:
        return "it has computed fields or field serializers"
    if decorators.model_serializers:
        return "it has a model serializer"
    for name, info in cls.model_fields.items():
        if info.exclude or info.alias or info.serialization_alias:
            return f"field {name} is excluded or aliased"
        if any(isinstance(m, PlainSerializer | WrapSerializer) for m in info.metadata):
            return f"field {name} has a serializer"
        if not _is_float(info.annotation) and _holds_lone_float(info.annotation):
            return f"field {name} holds floats in a container"
    return None


def model_json(model: BaseModel) -> bytes:
    """``model.__pydantic_serializer__.to_json(model)``, byte for byte; much faster for a
    model of a :func:`json_native` class (anything else is left to pydantic)."""
    cls = type(model)
    check = _CHECKS.get(cls)
    if check is None:
        check = _CHECKS[cls] = _check_for(cls, set())
    if check(model):
        try:
            text = orjson.dumps(model, default=_DECIMAL_TEXT)
        except orjson.JSONEncodeError:
            pass
        else:
            # An exact-size copy: orjson returns its buffer shrunk in place, and keeping many
            # of those (a store keeps every chain row) leaves the allocator a gap after each,
            # so the heap grows and faults in fresh pages on every write (measured: several
            # times the cost of the encoding). The copy is a memcpy; the buffer is reused.
            return memoryview(text).tobytes()
    return model.__pydantic_serializer__.to_json(model)


def _always(model: Any) -> bool:
    return True


def _never(model: Any) -> bool:
    return False


_CHECKS: dict[type, Check] = {}


def _check_for(cls: type, visiting: set[type]) -> Check:
    """What must hold of a ``cls`` value for orjson to write it as pydantic would: never for a
    class not marked; otherwise its float fields hold floats, recursively."""
    if not _is_marked(cls):
        return _never
    if cls in visiting:  # a recursive model: left to pydantic, not worth a walk
        return _never
    visiting.add(cls)
    floats: list[str] = []
    children: list[tuple[str, type, Check]] = []
    for name, info in cls.model_fields.items():
        annotation = info.annotation
        if _is_float(annotation):
            floats.append(name)
            continue
        inner = _optional(annotation)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            child = _check_for(inner, visiting)
            if child is _never:
                return _never
            if child is not _always:
                children.append((name, inner, child))
        elif not _all_always(annotation, visiting):  # in a container or a union: no walk
            return _never
    visiting.discard(cls)
    if not floats and not children:
        return _always
    return _fields_check(tuple(floats), tuple(children))


def _is_marked(cls: type) -> TypeGuard[type[BaseModel]]:
    """``cls`` is a model class marked with :func:`json_native` itself (not by inheritance)."""
    return isinstance(cls, type) and _NATIVE in cls.__dict__ and issubclass(cls, BaseModel)


def _all_always(annotation: Any, visiting: set[type]) -> bool:
    """Every model class named inside ``annotation`` is always written by orjson as pydantic
    would, whatever its values."""
    return all(_check_for(nested, visiting) is _always for nested in _models_in(annotation))


def _fields_check(floats: tuple[str, ...], children: tuple[tuple[str, type, Check], ...]) -> Check:
    def check(model: Any) -> bool:
        values = model.__dict__
        for name in floats:
            value = values[name]
            if value is not None and type(value) is not float:
                return False
        for name, cls, child in children:
            value = values[name]
            if value is not None and (type(value) is not cls or not child(value)):
                return False
        return True

    return check


def _is_float(annotation: Any) -> bool:
    """``float`` or ``float | None``."""
    return annotation is float or set(_union_args(annotation)) == {float, type(None)}


def _optional(annotation: Any) -> Any:
    """``X`` for ``X | None``, else the annotation itself."""
    args = _union_args(annotation)
    if len(args) == 2 and type(None) in args:
        return args[0] if args[1] is type(None) else args[1]
    return annotation


def _union_args(annotation: Any) -> tuple[Any, ...]:
    origin = get_origin(annotation)
    return get_args(annotation) if origin is Union or origin is types.UnionType else ()


def _models_in(annotation: Any) -> list[type]:
    """Every model class named anywhere inside ``annotation``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _holds_lone_float(annotation: Any) -> bool:
    """True if ``float`` appears in ``annotation`` without ``int`` beside it (in a union with
    ``int``, pydantic writes an int as an int, as orjson does)."""
    if annotation is float:
        return True
    args = get_args(annotation)
    if int in args and float in args:
        args = tuple(a for a in args if a is not float)
    return any(_holds_lone_float(a) for a in args)
