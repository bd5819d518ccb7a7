"""A piece's frame is its template's HTML, made without rendering the template per frame
(rendering._stamped): the same bytes as Django's own render, for any text, id and offset."""

from __future__ import annotations

import logging

import pytest
from django.template import engines
from hypothesis import given
from hypothesis import strategies as st

from collab.chat import rendering

PIECES = pytest.mark.parametrize(
    ("stamped", "template"),
    [(rendering.frame_delta, rendering._delta), (rendering.frame_thinking, rendering._thinking)],
    ids=["delta", "thinking"],
)


def _django(template: object, message_id: int, offset: int, text: str) -> str:
    return str(template.render({"id": message_id, "offset": offset, "text": text})).strip()  # type: ignore[attr-defined]


@PIECES
def test_the_frame_templates_are_stamped(stamped: rendering.Piece, template: object) -> None:
    # The shipped templates pass the check: were they not, every frame would render the template.
    assert stamped.__name__ == "stamped"


@PIECES
@given(
    message_id=st.integers(min_value=1, max_value=2**53),
    offset=st.integers(min_value=0, max_value=2**40),
    text=st.text(),
)
def test_a_stamped_frame_is_the_templates_html(
    stamped: rendering.Piece, template: object, message_id: int, offset: int, text: str
) -> None:
    assert stamped(message_id, offset, text) == _django(template, message_id, offset, text)


@PIECES
@pytest.mark.parametrize(
    "text",
    ["", " ", "<script>alert(1)</script>", "a & b \"c\" 'd'", "{0} {{ id }} %s", "\x00i\x00", "\n\tx\n"],
)
def test_markup_and_markers_in_the_text_stay_text(stamped: rendering.Piece, template: object, text: str) -> None:
    html = stamped(12, 34, text)
    assert html == _django(template, 12, 34, text)
    assert "<script>" not in html


def _template(source: str) -> object:
    return engines["django"].from_string(source)


def test_braces_in_the_template_are_kept() -> None:
    piece = rendering._stamped(_template('<i data-x="{a}">{{ id }}:{{ offset }}:{{ text }}</i>'))
    assert piece.__name__ == "stamped"
    assert piece(1, 2, "<b>") == '<i data-x="{a}">1:2:&lt;b&gt;</i>'


@pytest.mark.parametrize(
    "source",
    [
        "<i>{{ id }}{{ id }}{{ offset }}{{ text }}</i>",  # a value shown twice
        "<i>{{ offset }}{{ text }}</i>",  # a value not shown
        "<i>{{ id }}{{ offset|add:1 }}{{ text }}</i>",  # a filter on a value
        "<i>{{ id }}{{ offset }}{{ text|upper }}</i>",
        # filters and tags whose effect only a long text shows (the samples alone would pass them)
        "<i>{{ id }}{{ offset }}{{ text|truncatechars:200 }}</i>",
        '<i>{{ id }}{{ offset }}{{ text|slice:":64" }}</i>',
        "<i>{{ id }}{{ offset }}{% if text|length < 100 %}{{ text }}{% endif %}</i>",
        "<i>{{ id }}{{ offset.real }}{{ text }}</i>",  # a lookup on a value
    ],
)
def test_a_template_that_does_more_is_rendered_as_usual(source: str, caplog: pytest.LogCaptureFixture) -> None:
    template = _template(source)
    with caplog.at_level(logging.WARNING, logger="collab.chat.rendering"):
        piece = rendering._stamped(template)
    assert piece.__name__ == "rendered"
    assert "not stamped" in caplog.text
    for text in ("ab<", "x" * 300):
        assert piece(5, 6, text) == _django(template, 5, 6, text)
