"""Records back from their JSON through their declared types (onceflow.rules.json_records)."""

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum

import pytest

from onceflow.rules import json_records


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Part:
    name: str
    color: Color


@dataclass(frozen=True)
class Whole:
    color: Color
    parts: tuple[Part, ...]
    offsets: dict[int, int]
    pair: tuple[int, str]
    ranges: dict[int, tuple[int, int]]
    maybe: Color | None = None
    tags: list[str] = field(default_factory=list)
    free: dict = field(default_factory=dict)


def test_each_field_comes_back_as_its_declared_type_through_json():
    w = Whole(Color.RED, (Part("a", Color.BLUE),), {0: 5, 3: 9}, (1, "x"), {2: (0, 10)}, Color.BLUE, ["t"], {"k": 1})
    back = json_records.from_json(Whole, json.loads(json.dumps(asdict(w))))
    assert back == w
    assert type(back.color) is Color and type(back.parts) is tuple and type(back.parts[0]) is Part
    assert list(back.offsets) == [0, 3] and back.ranges[2] == (0, 10)


def test_unknown_keys_are_ignored_missing_ones_take_their_default_or_are_refused():
    d = {"color": "blue", "parts": [], "offsets": {}, "pair": [1, "y"], "ranges": {}, "written_by": "a newer onceflow"}
    w = json_records.from_json(Whole, d)
    assert w.maybe is None and w.tags == [] and w.color is Color.BLUE
    with pytest.raises(TypeError):
        json_records.from_json(Whole, {"color": "red"})
    with pytest.raises(ValueError):
        json_records.from_json(Part, {"name": "a", "color": "green"})
