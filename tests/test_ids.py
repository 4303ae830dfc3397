"""The id rules are matched in full: nothing slips past them before a final newline."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hearth
from hearth.errors import ConfigurationError, InvalidId
from hearth.ids import check_id

_ALLOWED_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_ALLOWED = _ALLOWED_FIRST + "._:-"
# The characters that matter at the edge of the rule: line ends of every kind, controls, NUL,
# path separators and look-alikes.
_HOSTILE = [
    "\n", "\r", "\r\n", "\x00", "\t", "\x0b", "\x0c", "\x1b", "\x7f", "\x85",
    "\u2028", "\u2029", "\u200b", "\ufeff", "/", "\\", " ", "%", "?", "#", "é", "١",
]  # fmt: skip


def _is_valid(text: str) -> bool:
    """The rule, spelled out without a regex."""
    return 1 <= len(text) <= 128 and text[0] in _ALLOWED_FIRST and all(c in _ALLOWED for c in text)


@st.composite
def ids_around_the_rule(draw: st.DrawFn) -> str:
    length = draw(st.sampled_from([1, 2, 127, 128, 129]) | st.integers(1, 130))
    text = list(draw(st.text(alphabet=_ALLOWED, min_size=length, max_size=length)))
    text[0] = draw(st.sampled_from(_ALLOWED_FIRST))
    for _ in range(draw(st.integers(0, 2))):
        where = draw(st.sampled_from(["end", "start", "middle"]))
        bad = draw(st.sampled_from(_HOSTILE) | st.characters(categories=["Cc", "Zl", "Zp", "Cf"]))
        if where == "end":
            text.append(bad)
        elif where == "start":
            text.insert(0, bad)
        else:
            text.insert(draw(st.integers(0, len(text))), bad)
    return "".join(text)


@settings(max_examples=400, deadline=None)
@given(ids_around_the_rule())
def test_check_id_accepts_exactly_the_ids_the_rule_allows(text: str) -> None:
    if _is_valid(text):
        assert check_id(text) == text
    else:
        with pytest.raises(InvalidId):
            check_id(text)


@pytest.mark.parametrize("text", ["abc\n", "abc\r\n", "a\u2028", "a" * 128 + "\n", "abc\x00"])
def test_an_id_with_a_trailing_line_end_is_refused(text: str) -> None:
    with pytest.raises(InvalidId):
        check_id(text)


def test_a_dollar_anchored_match_would_let_a_newline_through() -> None:
    """Why full matching: the planted fault (``re.match`` with ``$``) accepts ``abc\\n``."""
    assert re.match(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", "abc\n") is not None
    with pytest.raises(InvalidId):
        check_id("abc\n")


@pytest.mark.parametrize("name", ["shop\n", "shop\u2028", "Shop", "sh op"])
def test_agent_names_are_matched_in_full(name: str) -> None:
    def render(ctx: hearth.AgentContext) -> str:
        return "x"

    render.__name__ = name
    with pytest.raises(ConfigurationError):
        hearth.agent(render)


@pytest.mark.parametrize("name", ["look_up\n", "lookup\u2028", "café", "٣tool", "a" * 65])
def test_tool_names_are_matched_in_full_and_ascii(name: str) -> None:
    async def fn() -> str:
        return "x"

    with pytest.raises(ConfigurationError):
        hearth.tool(name=name)(fn)
