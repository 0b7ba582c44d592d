"""Dataclasses back from their JSON: the one conversion for every record the platform writes as JSON and reads again
(a DAG task's XCom result, a savepoint's manifest, a reconciliation result, a trigger's payload).

JSON loses what the field types say: an Enum comes back as its value, a tuple as a list, a dict's int keys as
strings, a nested dataclass as a dict. `from_json` puts each field back to its declared type, read from the class's
annotations, so no record lists its own conversions by hand. Keys the class does not have are ignored (a record
written by an older or newer onceflow still reads); a field without its key takes its default, or the class refuses.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Mapping
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


def from_json(cls: type[T], d: Mapping[str, Any]) -> T:
    """An instance of the dataclass `cls` from `d` (its fields as JSON gives them back)."""
    hints = get_type_hints(cls)
    given = {f.name: convert(hints[f.name], d[f.name]) for f in dataclasses.fields(cls) if f.init and f.name in d}  # type: ignore[arg-type]
    return cls(**given)


def convert(tp: Any, v: Any) -> Any:
    """`v`, as JSON gave it back, as the type `tp` says."""
    if v is None:
        return None
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        return convert(kinds[0], v) if len(kinds) == 1 else v
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(v)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(v, Mapping):
        return from_json(tp, v)
    if origin is tuple and isinstance(v, list | tuple):
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(convert(args[0], x) for x in v)
        return tuple(convert(a, x) for a, x in zip(args, v, strict=False)) if args else tuple(v)
    if origin is list and isinstance(v, list):
        return [convert(args[0], x) for x in v] if args else list(v)
    if origin in (dict, Mapping) and isinstance(v, Mapping) and len(args) == 2:
        return {convert(args[0], k): convert(args[1], x) for k, x in v.items()}
    if tp is int and isinstance(v, str):  # a dict key
        return int(v)
    return v
