"""One validator per parameter (pytest_ptq.params): a number written as text is refused with
advice that holds for the number given."""

from __future__ import annotations

import pytest

from pytest_ptq import params
from pytest_ptq.errors import PTQError

WHOLE = [(params.whole, "a whole number"), (params.rank_samples, "a whole number >= 1 or 'all'"),
         (params.auto_count, "'auto' or a whole number >= 1")]


@pytest.mark.parametrize("check, must", WHOLE)
@pytest.mark.parametrize("text", ["3.5", "0.25", "nan", "inf"])
def test_quoted_text_of_no_whole_number_is_not_told_to_lose_its_quotes(check, must, text):
    """whole("3.5") said "write the number without quotes", and 3.5 written so is refused in
    turn as no whole number: the sentence now says that at once."""
    with pytest.raises(PTQError):  # the advice would lead here: the number itself is refused
        check(float(text), "'n'")
    with pytest.raises(PTQError) as exc:
        check(text, "'n'")
    said = str(exc.value)
    assert said.startswith(f"'n' must be {must}, got ") and text in said, said
    assert "without quotes" not in said, said


@pytest.mark.parametrize("check, must", WHOLE)
@pytest.mark.parametrize("text", ["3", "3.0", "1e1"])
def test_quoted_text_of_a_whole_number_is_told_to_lose_its_quotes(check, must, text):
    assert check(float(text), "'n'") == int(float(text))  # the advice holds: the number itself is taken
    with pytest.raises(PTQError, match=f"got the text '{text}'; write the number without quotes"):
        check(text, "'n'")
