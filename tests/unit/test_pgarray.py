from __future__ import annotations

import math

import pytest

from postbox import pgarray


def test_literals() -> None:
    assert pgarray.ints([3, 1, 2]) == "{3,1,2}"
    assert pgarray.ints([]) == "{}"
    assert pgarray.floats([0.5, None, 2]) == "{0.5,NULL,2.0}"
    assert pgarray.words(["succeeded", "retrying", "1732900000000-0"]) == "{succeeded,retrying,1732900000000-0}"
    assert pgarray.texts_or_null([None, None]) is None
    assert pgarray.texts_or_null([None, 'x "y"']) == [None, 'x "y"']


@pytest.mark.parametrize("bad", [["a,b"], ["a b"], ['"'], ["{"], ["NULL"], [""], ["é"]])
def test_words_that_would_need_quoting_are_refused(bad: list[str]) -> None:
    with pytest.raises(ValueError):
        pgarray.words(bad)


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1"])
def test_floats_must_be_finite_numbers(bad: object) -> None:
    with pytest.raises(ValueError):
        pgarray.floats([bad])  # type: ignore[list-item]


def test_words_or_null_writes_none_as_null_and_checks_the_words() -> None:
    assert pgarray.words_or_null(["1-0", None, "17-3"]) == "{1-0,NULL,17-3}"
    assert pgarray.words_or_null([None]) == "{NULL}"
    assert pgarray.words_or_null([]) == "{}"
    with pytest.raises(ValueError):
        pgarray.words_or_null(["a b", None])
    with pytest.raises(ValueError):
        pgarray.words_or_null(["NULL"])  # a word reading NULL would be taken for one
