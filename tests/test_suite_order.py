"""The order a test run hands its tests out in (tests/conftest.py `longest_compiles_first`): the GPU suite's
longest compiles first, a fixture's group together, everything else as collected."""

from dataclasses import dataclass, field

import pytest

from .conftest import longest_compiles_first


@dataclass
class _Item:
    nodeid: str
    marks: dict = field(default_factory=dict)

    def get_closest_marker(self, name):
        return self.marks.get(name)


def _item(nodeid: str, seconds: float | None = None, group: str | None = None, by_keyword: bool = False) -> _Item:
    marks = {}
    if seconds is not None:
        marks["compiles"] = pytest.mark.compiles(seconds).mark
    if group is not None:
        marks["xdist_group"] = (
            pytest.mark.xdist_group(name=group) if by_keyword else pytest.mark.xdist_group(group)
        ).mark
    return _Item(nodeid, marks)


def test_units_go_longest_first_and_a_group_stays_together():
    items = [
        _item("a"),
        _item("dac_1", 199, group="dac"),
        _item("b"),
        _item("onnx", 165),
        _item("dac_2", group="dac", by_keyword=True),
        _item("predictor", 211),
        _item("c"),
        _item("dac_3", 10, group="dac"),
    ]
    order = [i.nodeid for i in longest_compiles_first(items)]
    # the group weighs 199 + 10 and keeps its tests' order; unmarked tests keep theirs, after every marked unit
    assert order == ["predictor", "dac_1", "dac_2", "dac_3", "onnx", "a", "b", "c"]


def test_a_run_without_marks_keeps_its_order():
    items = [_item(n) for n in "zyxw"]
    assert longest_compiles_first(items) == items
