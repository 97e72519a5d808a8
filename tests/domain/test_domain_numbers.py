"""The one grammar for numbers a user types (qlactors/domain/numbers.py; docs/cli.md "Numbers"):
plain ASCII decimal digits, an optional leading `-`, a fraction only for decimals, at most 40
characters; everything Python's int() and float() would also take is refused."""

from __future__ import annotations

from decimal import Decimal

import pytest

from qlactors.domain.numbers import WHOLE_HINT, parse_decimal, parse_whole, whole_or_none
from qlactors.errors import BadInput

# What int() or float() accepts and a user does not mean.
NOT_NUMBERS = ["", " 5", "5 ", "+5", "1_000", "1e3", "1E3", "0x10", "nan", "inf", "-inf", "٣", "５",
               "5\n", "--5", "-", "5-", "1,000", "١٢"]


@pytest.mark.parametrize("text, value", [("0", 0), ("5", 5), ("007", 7), ("-3", -3), ("-0", 0),
                                         ("1000000", 1_000_000)])
def test_whole_digits_with_an_optional_minus_are_their_int(text, value):
    assert whole_or_none(text) == value
    assert parse_whole("--limit", text) == value


@pytest.mark.parametrize("text", [*NOT_NUMBERS, "2.5", "5.", ".5"])
def test_anything_else_is_no_whole_number(text):
    assert whole_or_none(text) is None
    with pytest.raises(BadInput) as err:
        parse_whole("--limit", text)
    assert str(err.value) == f"--limit: {text!r} {WHOLE_HINT}"
    assert WHOLE_HINT == "is not a whole number (digits only, e.g. 5)"


@pytest.mark.parametrize("value", [None, 5, 5.0, b"5", True])
def test_a_whole_number_must_be_text(value):
    assert whole_or_none(value) is None
    with pytest.raises(BadInput, match=r"^--grace: .* is not a whole number"):
        parse_whole("--grace", value)


def test_a_whole_number_may_have_40_characters_and_not_41():
    assert whole_or_none("9" * 40) == int("9" * 40)
    assert whole_or_none("-" + "9" * 39) == -int("9" * 39)
    assert whole_or_none("9" * 41) is None
    assert whole_or_none("-" + "9" * 40) is None
    assert whole_or_none("1" * 1_000_000) is None  # a pasted megabyte is refused, not converted


def test_parse_whole_raises_the_error_class_it_is_given():
    class SpecError(BadInput):
        pass

    with pytest.raises(SpecError, match=r"^N: 'x' is not a whole number"):
        parse_whole("N", "x", SpecError)


@pytest.mark.parametrize("text, value", [("2", Decimal("2")), ("0.5", Decimal("0.5")),
                                         ("2.250", Decimal("2.250")), ("-1.5", Decimal("-1.5")),
                                         ("0.0001", Decimal("0.0001"))])
def test_decimals_are_exact(text, value):
    got = parse_decimal("--timeout", text, "seconds")
    assert type(got) is Decimal and got == value
    assert str(got) == text  # exact: no binary float on the way, trailing zeros kept


def test_a_decimal_is_never_rounded_through_a_float():
    assert parse_decimal("--backoff", "0.1", "seconds") * 3 == Decimal("0.3")


@pytest.mark.parametrize("text", [*NOT_NUMBERS, "5.", ".5", "1.2.3", "1.-2", "-.5", "Infinity"])
def test_anything_else_is_no_decimal_and_the_message_names_the_option_and_unit(text):
    with pytest.raises(BadInput) as err:
        parse_decimal("--timeout", text, "seconds")
    assert str(err.value) == (f"--timeout: {text!r} is not a number of seconds (digits with an optional "
                              "fraction, e.g. 2.5; no exponent, '_' or spaces)")


@pytest.mark.parametrize("value", [None, 2.5, 2, Decimal("2.5")])
def test_a_decimal_must_be_text(value):
    with pytest.raises(BadInput, match=r"^--max-age: .* is not a number of days"):
        parse_decimal("--max-age", value, "days")


def test_a_decimal_may_have_40_characters_and_not_41():
    text = "1" * 20 + "." + "2" * 19
    assert len(text) == 40 and parse_decimal("x", text, "seconds") == Decimal(text)
    with pytest.raises(BadInput):
        parse_decimal("x", text + "2", "seconds")


def test_parse_decimal_raises_the_error_class_it_is_given():
    class SpecError(BadInput):
        pass

    with pytest.raises(SpecError, match=r"^--timeout: 'soon' is not a number of seconds"):
        parse_decimal("--timeout", "soon", "seconds", SpecError)
