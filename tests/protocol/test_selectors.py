"""JMS selectors (proxy.selectors): the grammar, three-valued logic, type rules, errors.

Pure in-memory: selectors are evaluated against a dict through
``Selector.evaluate``; tests/protocol/test_selector_fields.py covers encoded
AMQP messages. docs/selectors.md is the reference these follow.
"""

from __future__ import annotations

import random
import time

import pytest
from proton import ulong

from proxy.selectors import Selector, SelectorError, parse

T, F, U = True, False, None


def ev(selector: str, **values):
    return parse(selector).evaluate(values.get)


# -- literals, identifiers, keywords -------------------------------------------------------


@pytest.mark.parametrize("literal, value", [
    ("'abc'", "abc"), ("''", ""), ("'it''s'", "it's"), ("''''", "'"), ("'a''''b'", "a''b"),
    ("'%_.('", "%_.("), ("'ünï €'", "ünï €"),
    ("12", 12), ("0", 0), ("12L", 12), ("12l", 12), ("0x1F", 31), ("0XffL", 255), ("017", 15),
    ("9223372036854775807", 2**63 - 1),
    ("1.5", 1.5), (".5", 0.5), ("7.", 7.0), ("1E3", 1000.0), ("1e3", 1000.0), ("2.5e-3", 0.0025),
    ("5E+2", 500.0), ("1.5F", 1.5), ("2D", 2.0), ("2.5d", 2.5), ("3f", 3.0),
])
def test_literals(literal, value):
    assert ev(f"x = {literal}", x=value) is T
    assert parse(f"{literal} = x").evaluate({"x": value}.get) is T


def test_exact_and_approximate_numbers_are_equal_when_their_values_are():
    assert ev("x = 1.0", x=1) is T
    assert ev("x = 1", x=1.0) is T
    assert ev("1 = 1.0") is T
    assert ev("x < 1.5", x=1) is T
    assert ev("x > y", x=2, y=1.5) is T
    assert ev("x = 0.1", x=0.1) is T


def test_negative_literals_and_unary_signs():
    assert ev("x = -5", x=-5) is T
    assert ev("x > -5.5", x=-5) is T
    assert ev("-x = 5", x=-5) is T
    assert ev("- -x = 5", x=5) is T
    assert ev("+x = 5", x=5) is T
    assert ev("-x = 5", x="-5") is U  # not a number: unknown
    assert ev("x = -0x10", x=-16) is T


@pytest.mark.parametrize("selector", [
    "x is null", "x IS NULL", "x Is Null", "NOT x is not null", "x iS nOt NuLl or TRUE",
    "y between 1 and 3", "y BETWEEN 1 AND 3 and not FALSE", "z like 'a%'", "z in ('a')",
    "z LIKE 'a!%' escape '!' or true", "tRuE", "NOT fAlSe",
])
def test_keywords_are_case_insensitive(selector):
    assert ev(selector, y=2, z="a") is T


def test_identifiers_are_case_sensitive_java_identifiers():
    values = {"color": "red", "Color": "blue", "_a$1": 1, "$x": 2, "ünï": 3, "JMSX_custom": 4}
    lookup = values.get
    assert parse("color = 'red' AND Color = 'blue'").evaluate(lookup) is T
    assert parse("COLOR = 'red'").evaluate(lookup) is U
    assert parse("_a$1 = 1 AND $x = 2 AND ünï = 3 AND JMSX_custom = 4").evaluate(lookup) is T
    assert parse("x1 IS NULL").names == {"x1"}


def test_quoted_identifiers_take_any_name():
    assert ev('"my-prop" = 1', **{"my-prop": 1}) is T
    assert ev('"say ""hi""" = 2', **{'say "hi"': 2}) is T
    assert parse('"a.b" IS NULL AND c > 1').names == {"a.b", "c"}


def test_comments_are_white_space():
    assert ev("x = 1 -- the rest is a comment AND x = 2", x=1) is T
    assert ev("x = 1 /* AND x = 2 */ OR x = 3", x=1) is T
    assert ev("x /**/=/* */1", x=1) is T
    assert ev("x = 1 -- first\nAND y = 2", x=1, y=3) is F


# -- comparison and types ------------------------------------------------------------------


@pytest.mark.parametrize("selector, expected", [
    ("x = 5", T), ("x <> 5", F), ("x > 4", T), ("x >= 5", T), ("x < 5", F), ("x <= 5", T),
    ("x = 6", F), ("x <> 6", T), ("x > 5", F), ("x < 6", T), ("x >= 5.5", F), ("x <= 4.99", F),
    ("4 < x", T), ("5 >= x", T), ("6 <= x", F), ("5 = x", T), ("5 <> x", F),
])
def test_number_comparisons(selector, expected):
    assert ev(selector, x=5) is expected


def test_strings_compare_with_equals_and_not_equals():
    assert ev("s = 'abc'", s="abc") is T
    assert ev("s <> 'abc'", s="abc") is F
    assert ev("s = 'ABC'", s="abc") is F
    assert ev("'abc' = s", s="abc") is T
    assert ev("s = t", s="abc", t="abc") is T
    assert ev("s <> t", s="abc", t="abd") is T


def test_two_string_values_order_lexically_as_in_artemis():
    assert ev("s < t", s="abc", t="abd") is T
    assert ev("s >= t", s="abc", t="abd") is F
    assert ev("s BETWEEN t AND u", s="b", t="a", u="c") is T


def test_booleans_compare_with_equals_and_not_equals():
    assert ev("b = TRUE", b=True) is T
    assert ev("b = FALSE", b=True) is F
    assert ev("b <> FALSE", b=True) is T
    assert ev("TRUE = b", b=False) is F
    assert ev("b = c", b=True, c=True) is T
    assert ev("b < c", b=False, c=True) is F  # booleans are not ordered
    assert ev("(x > 1) = TRUE", x=2) is T
    assert ev("(x > 1) = b", x=0, b=False) is T


@pytest.mark.parametrize("selector, values", [
    ("x = 1", {"x": "1"}), ("x = '1'", {"x": 1}), ("x = TRUE", {"x": 1}), ("x = 1", {"x": True}),
    ("x = 0", {"x": False}), ("x = FALSE", {"x": 0}), ("x = 'true'", {"x": True}),
    ("x = y", {"x": 1, "y": "1"}), ("x = y", {"x": True, "y": 1}), ("x > 0", {"x": "5"}),
    ("x < y", {"x": 1, "y": "2"}), ("x >= 0", {"x": True}), ("x BETWEEN 0 AND 9", {"x": "5"}),
    ("x NOT BETWEEN 0 AND 9", {"x": "5"}),
])
def test_values_of_different_types_are_never_equal_nor_ordered(selector, values):
    assert parse(selector).evaluate(values.get) is F


def test_not_equal_between_different_types_is_true_as_in_artemis():
    assert ev("x <> 1", x="1") is T
    assert ev("x <> '1'", x=1) is T
    assert ev("x <> TRUE", x=1) is T
    assert ev("x <> y", x=True, y=1) is T


# -- arithmetic ----------------------------------------------------------------------------


@pytest.mark.parametrize("selector", [
    "2 + 3 * 4 = 14", "(2 + 3) * 4 = 20", "10 - 2 - 3 = 5", "2 * 3 + 4 = 10", "-2 * -3 = 6",
    "x + 1 = 6", "x * 2.5 = 12.5", "x - 10 = -5", "x / 2 = 2.5", "7 / 2 = 3.5", "x / 5 = 1",
    "x + y * 2 = 11", "(x + y) * 2 = 16", "x * -1 < 0", "1.5 + 1 = 2.5", "x / 2.0 = 2.5",
    "10 / 4 * 2 = 5", "7 % 2 = 1", "-7 % 2 = -1", "x % 2 = 1", "x % 2.5 = 0", "1 + x % 3 = 3",
])
def test_arithmetic(selector):
    assert ev(selector, x=5, y=3) is T


def test_arithmetic_on_anything_but_numbers_is_unknown():
    assert ev("x + 1 = 2", x="1") is U
    assert ev("x * 2 = 2", x=True) is U
    assert ev("x + 1 = 2", x=None) is U
    assert ev("x + y > 0", x=1) is U
    assert ev("-x > 0", x="a") is U
    assert ev("x + NULL = 1", x=1) is U


def test_division_by_zero_is_unknown():
    assert ev("x / 0 = 1", x=1) is U
    assert ev("x % 0 = 1", x=1) is U
    assert ev("x / y > 0", x=1, y=0) is U
    assert ev("x / y > 0", x=1, y=0.0) is U
    assert ev("NOT (x / 0 = 1)", x=1) is U
    assert ev("x / 0 = 1 OR x = 1", x=1) is T


def test_overflowing_arithmetic_is_unknown():
    assert ev("x * 1.0 > 0", x=10**400) is U


# -- three-valued logic --------------------------------------------------------------------

# t, f are boolean properties, u is missing (NULL)
TRUTH = {"t": True, "f": False}


@pytest.mark.parametrize("left, right, expected_and, expected_or", [
    ("t", "t", T, T), ("t", "f", F, T), ("t", "u", U, T),
    ("f", "t", F, T), ("f", "f", F, F), ("f", "u", F, U),
    ("u", "t", U, T), ("u", "f", F, U), ("u", "u", U, U),
])
def test_and_or_truth_tables(left, right, expected_and, expected_or):
    assert parse(f"{left} AND {right}").evaluate(TRUTH.get) is expected_and
    assert parse(f"{left} OR {right}").evaluate(TRUTH.get) is expected_or
    assert parse(f"NOT ({left} AND {right})").evaluate(TRUTH.get) is (
        None if expected_and is None else not expected_and)


@pytest.mark.parametrize("operand, expected", [("t", F), ("f", T), ("u", U), ("NOT t", T),
                                               ("NOT NOT u", U), ("NULL", U)])
def test_not_truth_table(operand, expected):
    assert parse(f"NOT {operand}").evaluate(TRUTH.get) is expected


def test_long_and_or_chains():
    assert parse("t AND t AND t AND u").evaluate(TRUTH.get) is U
    assert parse("t AND u AND f AND t").evaluate(TRUTH.get) is F
    assert parse("f OR u OR f").evaluate(TRUTH.get) is U
    assert parse("f OR u OR t OR f").evaluate(TRUTH.get) is T
    assert parse(" AND ".join(["t"] * 300)).evaluate(TRUTH.get) is T


@pytest.mark.parametrize("selector", ["u = 1", "u <> 1", "u > 1", "u >= 1", "u < 1", "u <= 1",
                                      "1 = u", "1 <> u", "'a' = u", "TRUE = u", "u = v",
                                      "u LIKE 'a'", "u NOT LIKE 'a'", "u IN ('a')",
                                      "u NOT IN ('a')", "u BETWEEN 1 AND 2",
                                      "u NOT BETWEEN 1 AND 2", "-u = 0", "+u = 0", "u * 2 = 0",
                                      "u / 2 = 0", "u + 2 = 0", "u - 2 = 0", "u", "NOT u"])
def test_null_makes_comparisons_and_arithmetic_unknown(selector):
    selected = parse(selector)
    assert selected.evaluate({}.get) is U
    assert parse(f"NOT ({selector})").evaluate({}.get) is U
    assert selected.evaluate({"v": 1}.get) is U


def test_is_null_and_is_not_null():
    assert ev("x IS NULL") is T
    assert ev("x IS NULL", x=0) is F
    assert ev("x IS NOT NULL", x="") is T
    assert ev("x IS NOT NULL") is F
    assert ev("x + 1 IS NULL", x="a") is T
    assert ev("(x > 1) IS NULL") is T
    assert ev("NOT x IS NULL", x=1) is T


def test_identifier_as_a_condition():
    assert ev("b", b=True) is T
    assert ev("b", b=False) is F
    assert ev("b") is U
    assert ev("b", b="true") is F  # not a boolean: FALSE, as in Artemis
    assert ev("NOT b", b=1) is T
    assert ev("b AND x = 1", b=True, x=1) is T


def test_constant_selectors():
    assert ev("TRUE") is T
    assert ev("FALSE") is F
    assert ev("NULL") is U
    assert ev("1 = 1") is T
    assert ev("'a' <> 'a'") is F
    assert ev("FALSE OR x = 1", x=1) is T


# -- precedence ----------------------------------------------------------------------------


def test_and_binds_tighter_than_or():
    values = {"a": True, "b": False, "c": False}
    assert parse("a OR b AND c").evaluate(values.get) is T  # a OR (b AND c)
    assert parse("(a OR b) AND c").evaluate(values.get) is F
    assert parse("b AND c OR a").evaluate(values.get) is T


def test_not_binds_tighter_than_and_but_looser_than_comparison():
    values = {"a": True, "b": False, "x": 2}
    assert parse("NOT a AND b").evaluate(values.get) is F  # (NOT a) AND b
    assert parse("NOT (a AND b)").evaluate(values.get) is T
    assert parse("NOT x = 1").evaluate(values.get) is T  # NOT (x = 1), as in SQL
    assert parse("NOT x + 1 = 3").evaluate(values.get) is F
    assert parse("NOT x BETWEEN 1 AND 3").evaluate(values.get) is F


def test_comparison_binds_looser_than_arithmetic():
    assert ev("x + 1 > 2 * 2", x=4) is T
    assert ev("x + 1 = y - 1", x=1, y=3) is T
    assert ev("x BETWEEN 1 + 1 AND 2 * 2", x=4) is T


# -- BETWEEN, IN, LIKE ---------------------------------------------------------------------


@pytest.mark.parametrize("value, inside", [(1, F), (2, T), (3, T), (4, T), (5, F), (2.0, T),
                                           (4.5, F), (1.99, F)])
def test_between_is_inclusive(value, inside):
    assert ev("x BETWEEN 2 AND 4", x=value) is inside
    assert ev("x NOT BETWEEN 2 AND 4", x=value) is (not inside)
    assert ev("x BETWEEN y AND z", x=value, y=2, z=4) is inside
    assert ev("x NOT BETWEEN y AND z", x=value, y=2, z=4) is (not inside)


def test_between_with_null():
    assert ev("x BETWEEN 1 AND 3") is U
    assert ev("x NOT BETWEEN 1 AND 3") is U
    assert ev("x BETWEEN y AND 3", x=2) is U
    assert ev("x BETWEEN y AND 3", x=5) is F  # x <= 3 is FALSE whatever y is
    assert ev("x NOT BETWEEN y AND 3", x=5) is T
    assert ev("x NOT BETWEEN y AND 3", x=2) is U


def test_in():
    assert ev("c IN ('red', 'green')", c="red") is T
    assert ev("c IN ('red', 'green')", c="blue") is F
    assert ev("c NOT IN ('red', 'green')", c="blue") is T
    assert ev("c NOT IN ('red', 'green')", c="green") is F
    assert ev("c IN ('red')", c="Red") is F
    assert ev("c IN ('it''s')", c="it's") is T
    many = ", ".join(f"'v{i}'" for i in range(100))
    assert ev(f"c IN ({many})", c="v57") is T
    assert ev(f"c NOT IN ({many})", c="v100") is T


def test_in_with_null_or_a_non_string_is_unknown():
    assert ev("c IN ('a', 'b')") is U
    assert ev("c NOT IN ('a', 'b')") is U
    assert ev("c IN ('1')", c=1) is U
    assert ev("c NOT IN ('1')", c=1) is U


@pytest.mark.parametrize("pattern, value, expected", [
    ("'abc'", "abc", T), ("'abc'", "abcd", F), ("'abc'", "xabc", F), ("'a%'", "abc", T),
    ("'a%'", "a", T), ("'a%'", "ba", F), ("'%c'", "abc", T), ("'%c'", "abcd", F),
    ("'%b%'", "abc", T), ("'%b%'", "ac", F), ("'%'", "", T), ("'%'", "anything", T),
    ("''", "", T), ("''", "a", F), ("'_'", "a", T), ("'_'", "", F), ("'_'", "ab", F),
    ("'a_c'", "abc", T), ("'a_c'", "ac", F), ("'a_c'", "abbc", F), ("'%a_c%'", "xxabcxx", T),
    ("'a%b%c'", "abc", T), ("'a%b%c'", "aXbYc", T), ("'a%b%c'", "acb", F), ("'a%a'", "a", F),
    ("'a%a'", "aa", T), ("'%ab%ab%'", "abab", T), ("'%ab%ab%'", "abXab", T),
    ("'%ab%ab%'", "aba", F), ("'_%_'", "ab", T), ("'_%_'", "a", F), ("'%_b_%'", "xxbx", T),
    ("'%%'", "", T), ("'a%%b'", "ab", T), ("'%_%'", "", F),
    # regular-expression characters are literal
    ("'a.c'", "abc", F), ("'a.c'", "a.c", T), ("'(a)'", "(a)", T), ("'(a)'", "a", F),
    ("'a*'", "aaa", F), ("'a*'", "a*", T), ("'[ab]'", "a", F), ("'[ab]'", "[ab]", T),
    ("'a+b?'", "a+b?", T), ("'^a$'", "^a$", T), ("'a\\d'", "a\\d", T), ("'a\\d'", "a1", F),
    ("'a|b'", "a", F), ("'{1}'", "{1}", T), ("'.*'", "xyz", F), ("'%.%'", "a.b", T),
    # _ and % match any character, newlines too
    ("'a_b'", "a\nb", T), ("'a%b'", "a\n\nb", T), ("'it''s%'", "it's here", T),
    ("'ü_€'", "üx€", T),
])
def test_like(pattern, value, expected):
    assert ev(f"s LIKE {pattern}", s=value) is expected
    assert ev(f"s NOT LIKE {pattern}", s=value) is (not expected)


@pytest.mark.parametrize("selector, value, expected", [
    ("s LIKE '!_%' ESCAPE '!'", "_foo", T), ("s LIKE '!_%' ESCAPE '!'", "foo", F),
    ("s LIKE '100!%' ESCAPE '!'", "100%", T), ("s LIKE '100!%' ESCAPE '!'", "1000", F),
    ("s LIKE 'a!!b' ESCAPE '!'", "a!b", T), ("s LIKE 'a!b' ESCAPE '!'", "a!b", T),
    ("s LIKE 'a\\_b' ESCAPE '\\'", "a_b", T), ("s LIKE 'a\\_b' ESCAPE '\\'", "axb", F),
    ("s LIKE 'a\\b' ESCAPE '\\'", "a\\b", T),
    ("s LIKE '%_%' ESCAPE '%'", "_foo", T), ("s LIKE '%_%' ESCAPE '%'", "foo", F),
    ("s LIKE '_D7xlJIQn__' ESCAPE '_'", "XD7xlJIQn_", T),
    ("s LIKE '%D7xlJIQn%_' ESCAPE '%'", "XD7xlJIQn_", T),
    ("s LIKE '%D7xlJIQn%' ESCAPE '%'", "XD7xlJIQn_", T),
    ("s LIKE '%D7xlJIQn%%' ESCAPE '%'", "XD7xlJIQn_", F),
    ("s LIKE 'a.%' ESCAPE '.'", "a.b", F), ("s LIKE 'a.%' ESCAPE '.'", "a%", T),
    ("s LIKE 'a.%' ESCAPE '.'", "a.", F), ("s LIKE 'a._' ESCAPE '.'", "a_", T),
    ("s LIKE 'a._' ESCAPE '.'", "ab", F), ("s LIKE 'x''%' ESCAPE ''''", "x'yz", F),
    ("s LIKE 'x''%' ESCAPE ''''", "x%", T), ("s LIKE 'x''_%' ESCAPE ''''", "x_yz", T),
])
def test_like_escape(selector, value, expected):
    assert ev(selector, s=value) is expected


def test_like_with_null_or_a_non_string():
    assert ev("s LIKE 'a%'") is U
    assert ev("s NOT LIKE 'a%'") is U
    assert ev("s LIKE '1%'", s=12) is F  # as in Artemis
    assert ev("s NOT LIKE '1%'", s=12) is T


def test_like_never_backtracks():
    selector = parse("s LIKE '%a%a%a%a%a%a%a%a%b'")
    text = "a" * 20000
    started = time.perf_counter()
    assert selector.evaluate({"s": text}.get) is F
    assert selector.evaluate({"s": text + "b"}.get) is T
    assert parse("s LIKE '%a_a%a_a%a_a%b'").evaluate({"s": text}.get) is F
    assert time.perf_counter() - started < 1.0


def test_like_applies_to_expressions_too():
    assert ev("(s) LIKE 'a%'", s="ab") is T
    assert ev("'abc' LIKE 'a%'") is T


# -- the Selector object --------------------------------------------------------------------


def test_selector_attributes():
    selector = parse("color = 'red' AND (JMSPriority > 4 OR weight BETWEEN lo AND hi)")
    assert isinstance(selector, Selector)
    assert selector.text == "color = 'red' AND (JMSPriority > 4 OR weight BETWEEN lo AND hi)"
    assert selector.names == {"color", "JMSPriority", "weight", "lo", "hi"}
    assert selector.selects_all is False
    assert "color = 'red'" in repr(selector)


@pytest.mark.parametrize("text", ["", " ", " \t\r\n\f", "-- nothing", "/* nothing */"])
def test_an_empty_selector_selects_everything(text):
    selector = parse(text)
    assert selector.selects_all is True
    assert selector.names == frozenset()
    assert selector.text == text
    assert selector.evaluate({}.get) is True
    assert selector.matches(b"") is True
    assert selector.matches(b"\xff not a message") is True


def test_evaluate_reads_only_plain_values():
    assert ev("x = 5", x=ulong(5)) is T  # an int subclass counts as an int
    assert ev("x IS NULL", x=b"bytes") is T  # binary counts as NULL
    assert ev("x IS NULL", x=[1]) is T
    assert ev("x = 'a'", x=_Text("a")) is T


class _Text(str):
    pass


def test_evaluate_calls_lookup_only_for_what_it_needs():
    asked = []

    def lookup(name):
        asked.append(name)
        return {"a": False}.get(name)

    assert parse("a AND b").evaluate(lookup) is F
    assert asked == ["a"]


def test_the_error_is_a_value_error():
    with pytest.raises(ValueError):
        parse("a =")
    with pytest.raises(TypeError):
        parse(None)


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("text, position, message", [
    ("a = 1 AND", 9, "unexpected end of selector at position 9"),
    ("a = 1 AND AND b = 2", 10, "unexpected 'AND' at position 10"),
    ("x = 1 and and y = 2", 10, "unexpected 'and' at position 10"),
    ("a =", 3, "unexpected end of selector at position 3 (expected an operand)"),
    ("= 5", 0, "unexpected '=' at position 0"),
    ("a = 1 OR", 8, "unexpected end of selector"),
    ("(a = 1", 6, "expected ')' to close the '(' at position 0"),
    ("a = 1)", 5, "unexpected ')' at position 5"),
    ("a = 1 b = 2", 6, "unexpected 'b' at position 6"),
    ("a = 1 AMD b = 2", 6, "unexpected 'AMD' at position 6"),
    ("a # 1", 2, "unexpected character '#' at position 2"),
    ("a = 'abc", 4, "unterminated string starting at position 4"),
    ("a = 'it''s", 4, "unterminated string"),
    ('"abc = 1', 0, "unterminated quoted identifier"),
    ("a = 1 /* note", 6, "unterminated comment starting at position 6"),
    ("a != 1", 2, "use <> for 'not equal'"),
    ("a == 1", 3, "unexpected '=' at position 3"),
    ("a IN 'x'", 5, "unexpected string 'x' at position 5 (expected '(' and a list of strings"),
    ("a IN ()", 6, "unexpected ')' at position 6 (expected a string literal in the IN list)"),
    ("a IN ('x' 'y')", 10, "expected ',' or ')' in the IN list"),
    ("a IN ('x', 1)", 11, "unexpected '1' at position 11"),
    ("a IN ('x'", 9, "unexpected end of selector at position 9"),
    ("1 IN ('x')", 0, "IN needs an identifier on its left at position 0"),
    ("a LIKE b", 7, "unexpected 'b' at position 7 (expected a string pattern after LIKE)"),
    ("a LIKE 'x' ESCAPE 'ab'", 18, "ESCAPE needs exactly one character, found 'ab' at position 18"),
    ("a LIKE 'x' ESCAPE ''", 18, "ESCAPE needs exactly one character"),
    ("a LIKE 'x' ESCAPE 1", 18, "expected a one-character string after ESCAPE"),
    ("5 LIKE 'x'", 0, "LIKE needs a string but found a number at position 0"),
    ("a BETWEEN 1", 11, "(expected AND between the bounds of BETWEEN)"),
    ("a BETWEEN 1 OR 2", 12, "unexpected 'OR' at position 12"),
    ("a BETWEEN 'a' AND 'c'", 10, "a string can't be compared with 'BETWEEN' at position 10"),
    ("a IS 5", 5, "unexpected '5' at position 5 (expected NOT NULL or NULL after IS)"),
    ("a IS NOT 5", 9, "(expected NULL after IS NOT)"),
    ("a = NULL", 4, "NULL can't be compared with '=' at position 4 (use IS NULL"),
    ("NULL <> a", 0, "NULL can't be compared with '<>' at position 0"),
    ("a > NULL", 4, "NULL can't be compared with '>' at position 4"),
    ("a > 'x'", 4,
     "a string can't be compared with '>' at position 4 (strings only support = and <>)"),
    ("TRUE < a", 0, "a boolean can't be compared with '<' at position 0 (booleans only support"),
    ("(a = 1) > 0", 1, "a boolean can't be compared with '>' at position 1"),
    ("1 = 'x'", 2, "a number can't be compared with a string at position 2"),
    ("TRUE = 1", 5, "a boolean can't be compared with a number at position 5"),
    ("a + 'x' = 1", 4, "'+' needs numbers but found a string at position 4"),
    ("-'x' = a", 1, "'-' needs numbers but found a string at position 1"),
    ("TRUE * 2 = a", 0, "'*' needs numbers but found a boolean at position 0"),
    ("3 + 5", 0, "expected a condition but found a number at position 0"),
    ("'abc'", 0, "expected a condition but found a string at position 0"),
    ("TRUE AND 3 + 5", 9, "expected a condition but found a number at position 9"),
    ("NOT 'x'", 4, "expected a condition but found a string at position 4"),
    ("a = 1 OR 2", 9, "expected a condition but found a number at position 9"),
    ("=TEST 'test'", 0, "unexpected '=' at position 0"),
    ("prop1 = prop2 foo AND string = 'Test'", 14, "unexpected 'foo' at position 14"),
    ("12abc = 1", 0, "invalid number '12abc' at position 0"),
    ("a = 1.2.3", 4, "invalid number '1.2.3' at position 4"),
    ("a = 0x", 4, "invalid number '0x' at position 4"),
    ("a = 1e", 4, "invalid number '1e' at position 4"),
    ("a = 09", 4, "invalid octal number '09' at position 4"),
    ("a NOT = 1", 2, "unexpected 'NOT' at position 2"),
    ("NOT LIKE 'x'", 4, "unexpected 'LIKE' at position 4 (expected an operand)"),
    ("a = NOT b", 4, "unexpected 'NOT' at position 4"),
    ("a .b = 1", 2, "unexpected character '.' at position 2"),
    ("a = 1 ESCAPE", 6, "unexpected 'ESCAPE' at position 6"),
    ("XPATH '//a'", 6, "unexpected string '//a' at position 6"),
    ("a = 1 ^ 2", 6, "unexpected character '^' at position 6"),
    ("a % 'x' = 1", 4, "'%' needs numbers but found a string at position 4"),
    ('"" = 1', 0, "empty quoted identifier at position 0"),
])
def test_errors_say_what_and_where(text, position, message):
    with pytest.raises(SelectorError) as caught:
        parse(text)
    assert caught.value.position == position
    assert message in str(caught.value)
    assert f"position {position}" in str(caught.value)


def test_errors_on_selectors_that_nest_too_deeply():
    with pytest.raises(SelectorError, match="nests too deeply"):
        parse("(" * 60 + "a = 1" + ")" * 60)
    with pytest.raises(SelectorError, match="nests too deeply"):
        parse("NOT " * 60 + "a")
    with pytest.raises(SelectorError, match="too deeply nested"):
        parse(" + ".join(["a"] * 200) + " = 1")
    assert ev("(" * 30 + "a = 1" + ")" * 30, a=1) is T
    assert ev(" + ".join(["a"] * 50) + " = 50", a=1) is T


def test_any_token_soup_parses_or_raises_selector_error():
    pieces = ["a", "b", "'x'", "1", "2.5", "NULL", "TRUE", "NOT", "AND", "OR", "=", "<>", "<",
              ">=", "+", "-", "*", "/", "%", "(", ")", ",", "IN", "LIKE", "ESCAPE", "BETWEEN", "IS",
              "'%'", '"q"', "--", "/*", "*/", "0x", "09", "!", "''", "'", '"']
    generator = random.Random(1)
    for _ in range(5000):
        text = " ".join(generator.choice(pieces) for _ in range(generator.randint(0, 8)))
        try:
            selector = parse(text)
        except SelectorError as error:
            assert 0 <= error.position <= len(text)
            continue
        values = {"a": generator.choice([1, "x", True, None, 2.5]), "b": generator.choice([0, "y"])}
        assert selector.evaluate(values.get) in (T, F, U)
