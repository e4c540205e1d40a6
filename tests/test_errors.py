"""elmo_tf/errors.py: `check_int`, the int check of library arguments (the message names the argument and the value)."""

import re

import numpy as np
import pytest

from elmo_tf.errors import ElmoTFError, check_int


def test_check_int_returns_the_int_within_its_range():
    assert check_int("n", 3, 1) == 3
    assert check_int("n", None, 1, allow_none=True) is None
    assert check_int("n", 2**31 - 1, 1, maximum=2**31 - 1) == 2**31 - 1
    value = check_int("n", np.int64(7), 0, maximum=10)
    assert value == 7 and type(value) is int


@pytest.mark.parametrize(
    "value, kwargs, message",
    [
        (0, {}, "n must be an int >= 1, got 0"),
        (True, {}, "n must be an int >= 1, got True"),
        (2.0, {}, "n must be an int >= 1, got 2.0"),
        (None, {}, "n must be an int >= 1, got None"),
        (-1, dict(allow_none=True), "n must be None or an int >= 1, got -1"),
        (11, dict(maximum=10), "n must be an int in [1, 10], got 11"),
        (0, dict(maximum=10), "n must be an int in [1, 10], got 0"),
        ("5", dict(maximum=10, allow_none=True), "n must be None or an int in [1, 10], got '5'"),
    ],
)
def test_check_int_names_the_argument_the_range_and_the_value(value, kwargs, message):
    with pytest.raises(ElmoTFError, match=f"^{re.escape(message)}$") as info:
        check_int("n", value, 1, **kwargs)
    assert info.value.key == "n"
