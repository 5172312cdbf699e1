"""Erlang terms printed as RabbitMQ prints them in reply texts. Every expected text was produced by Erlang/OTP 25's
io_lib:format with the same format (~w, ~tp or ~p) and, for ~tp, the same text before it on the line."""

import datetime
import decimal

import pytest

# The modules under test, named once: the rest of the file uses only these names.
from protocol import erlang_terms as field_terms  # ~p of decoded field-table values, atoms, strings
from protocol import erlang_terms as frame_terms  # ~w and ~tp of the terms of frame errors

Atom = frame_terms.Atom
PREFIX = "FRAME_ERROR - type 1, all octets = "


def after(prefix: str, term) -> str:
    """`prefix` followed by ~tp of `term`, as io_lib:format("~s~tp", [Prefix, Term]) writes it."""
    return prefix + frame_terms.pretty(term, frame_terms.column_after(prefix))


@pytest.mark.parametrize(
    "term, printed",
    [
        ((Atom("invalid_frame_end_marker"), 0), "{invalid_frame_end_marker,0}"),
        (b"\x00\x3c", "<<0,60>>"),
        (b"abc", "<<97,98,99>>"),  # ~w never prints a binary as a string
        (Atom("unknown_frame"), "unknown_frame"),
    ],
)
def test_flat_form(term, printed):
    assert frame_terms.write(term) == printed


@pytest.mark.parametrize(
    "data, printed",
    [
        (bytes(range(16)), "<<0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15>>"),
        (b"\x01\x00\x01\x00\x00\x00\x00", "<<1,0,1,0,0,0,0>>"),
        (b"", "<<>>"),
        (b'hello\n"world"', '<<"hello\\n\\"world\\"">>'),
        (bytes(range(200, 216)), '<<"\xc8\xc9\xca\xcb\xcc\xcd\xce\xcf\xd0\xd1\xd2\xd3\xd4\xd5\xd6\xd7">>'),  # latin-1
        # too long for the line: filled up to column 80, continuation lines start under the first byte
        (bytes(range(128, 144)), "<<128,129,130,131,132,133,134,135,136,137,\n"
                                 + " " * 37 + "138,139,140,141,142,143>>"),
    ],
)
def test_pretty_binary_after_the_frame_error_prefix(data, printed):
    assert after(PREFIX, data) == PREFIX + printed


@pytest.mark.parametrize(
    "prefix, term, printed",
    [
        ("x" * 10, (Atom("frame_too_large"), 200000, 131064), "{frame_too_large,200000,131064}"),
        ("x" * 60, (Atom("frame_too_large"), 200000, 131064),
         "{frame_too_large,\n" + " " * 61 + "200000,131064}"),
        ("x" * 75, (Atom("frame_too_large"), 200000, 131064),
         "{frame_too_large,\n" + " " * 76 + "200000,\n" + " " * 76 + "131064}"),
        ("x" * 30, (Atom("unexpected_frame_type"), 123456789012345678901234567890, 98765432109876543210987654321, 5),
         "{unexpected_frame_type,\n" + " " * 34 + "123456789012345678901234567890,\n"
         + " " * 34 + "98765432109876543210987654321,5}"),
    ],
)
def test_pretty_tagged_tuple_breaks_lines_as_io_lib_does(prefix, term, printed):
    assert after(prefix, term) == prefix + printed


def test_chars_that_are_not_utf8_reach_the_client_as_replacement_characters():
    assert frame_terms.to_text('<<"\xc8">>') == '<<"\ufffd">>'
    assert frame_terms.to_text("<<0,60>>") == "<<0,60>>"


@pytest.mark.parametrize(
    "name, printed",
    [("hello_world", "hello_world"), ("Hello", "'Hello'"), ("x-foo", "'x-foo'"), ("it's", "'it\\'s'")],
)
def test_atoms_are_quoted_unless_plain_lower_case_words(name, printed):
    assert field_terms.erlang_atom(name) == printed


@pytest.mark.parametrize(
    "text, printed",
    [("plain", '"plain"'), ("tab\there", '"tab\\there"'), ("a\x01", "[97,1]")],
)
def test_strings_print_as_text_or_as_a_list_of_integers(text, printed):
    assert field_terms.erlang_string(text) == printed


@pytest.mark.parametrize(
    "value, printed",
    [
        ({"k": "v", "n": 5}, '[{<<"k">>,longstr,<<"v">>},{<<"n">>,signedint,5}]'),
        (["a", True], '[{longstr,<<"a">>},{bool,true}]'),
        (None, "undefined"),
        (False, "false"),
        (decimal.Decimal("-0.5"), "{1,-5}"),
        (datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC), "1577836800"),
    ],
)
def test_field_table_values_print_as_the_terms_rabbitmq_holds(value, printed):
    assert field_terms.erlang_term(value) == printed
