"""Rendered Markdown is sanitised (no script, no event handlers, no javascript: links, no raw
HTML), and a person's message shows what they typed (markup.as_typed)."""

from collections.abc import Callable
from html.parser import HTMLParser

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collab.chat import markup
from collab.chat.markup import render_markdown, render_now, render_user_markdown
from tests.test_fuzz import check_rendered
from tests.test_fuzz import markdown as fuzzed_markdown

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
    html = render_user_markdown("first line\nsecond line\nthird with `code`\n\nnext paragraph")
    assert html == "<p>first line<br>\nsecond line<br>\nthird with <code>code</code></p>\n<p>next paragraph</p>\n"


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


# --- a person's text, as typed (markup.as_typed) ------------------------------------------


@pytest.mark.parametrize(
    "typed",
    [
        'what is 17*23? "17*23" snake_case_name 2*3*4',
        "**not bold** and __not either__, *nor* _this_",
        "~~x~~ stays, ~so~ does this",
        "a*b*c and a_b_c and x**2**",
        "# 3 things today",
        "&copy; &amp; &#65; &lt;b&gt;",
        r"a \* b \_ c \# d \~ e \& f \\ g",
        "first\n---\nsecond\n===",
        "| a | b |\n|---|---|\n| 1 | 2 |",
    ],
)
def test_a_persons_text_shows_every_character_they_typed(typed: str) -> None:
    """No emphasis, strong, strikethrough, heading, rule, table or entity: what a person
    typed is what the room reads (a browser's text of the HTML is the text, line for line)."""
    html = render_user_markdown(typed)
    assert shown_text(html) == typed


@pytest.mark.parametrize(
    ("typed", "html"),
    [
        ("see `x*y*z` here", "<p>see <code>x*y*z</code> here</p>\n"),
        ("```python\nx = 1\n```", '<pre><code class="language-python"><span class="n">x</span>'),
        (
            "[the docs](https://example.com/a_b)",
            '<a href="https://example.com/a_b" rel="noopener noreferrer nofollow">the docs</a>',
        ),
        (
            "<https://example.com/x>",
            '<a href="https://example.com/x" rel="noopener noreferrer nofollow">https://example.com/x</a>',
        ),
        ("- one\n- two", "<ul>\n<li>one</li>\n<li>two</li>\n</ul>\n"),
        ("1. one\n2. two", "<ol>\n<li>one</li>\n<li>two</li>\n</ol>\n"),
        ("> quoted\n\nmine", "<blockquote>\n<p>quoted</p>\n</blockquote>\n<p>mine</p>\n"),
    ],
)
def test_a_person_still_has_code_links_lists_and_quotes(typed: str, html: str) -> None:
    assert html in render_user_markdown(typed)


@pytest.mark.parametrize(
    ("typed", "shown"),
    [
        (r"\[not a link](https://example.com)", "[not a link](https://example.com)"),
        (r"\`not code\`", "`not code`"),
        (r"\<https://example.com>", "<https://example.com>"),
        (r"\![not an image](/a.png)", "![not an image](/a.png)"),
        (
            "\\- not a list\n\\* nor this\n1\\. nor this\n\\> nor a quote",
            "- not a list\n* nor this\n1. nor this\n> nor a quote",
        ),
        (r"mid-line \- \> \. stay", r"mid-line \- \> \. stay"),
        (r"C:\\server\share and \\[x](/y)", "C:\\\\server\\share and \\\\x"),
    ],
)
def test_a_backslash_goes_only_where_it_stops_markup(typed: str, shown: str) -> None:
    """A person's backslash escape works where this dialect has something to stop (a
    link, code, an autolink, an image, a list, a quote); anywhere else it is shown."""
    assert shown_text(render_user_markdown(typed)) == shown


def test_an_assistant_keeps_full_markdown() -> None:
    html = render_markdown("# T\n\n**b** *i* ~~s~~ &copy; \\*\n\n---")
    assert "<h1>T</h1>" in html and "<strong>b</strong>" in html and "<em>i</em>" in html
    assert "<s>s</s>" in html and "\u00a9" in html and "<hr>" in html and "<p><strong>" in html and " *</p>" in html


# Text that holds no Markdown this dialect has (no `[`, backtick, `<`, line start): each
# character shows, whatever mix of `*`, `_`, `~`, `#`, `&`, `\\`, `|`, `=` it has.
typed_line = st.text(st.sampled_from("ab 17*23_~#&;=|\\!?\"'.,-+(){}^$%"), max_size=60).map(lambda t: "x" + t)


@given(typed_line)
def test_any_such_text_shows_as_typed(typed: str) -> None:
    assert shown_text(render_now(typed, user=True)) == typed.strip()


@given(fuzzed_markdown)
def test_a_persons_dialect_is_sanitised_too(source: str) -> None:
    check_rendered(render_now(source, user=True))


class _Text(HTMLParser):
    """What a browser shows of the HTML as text: a <br> or a block's end is a new line."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "br":
            self.parts.append("\n")


def shown_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    parser.close()
    return "".join(parser.parts).replace("\n\n", "\n").strip()


def test_an_agents_log_keeps_its_lines_and_formats_the_models_markdown() -> None:
    """markup.log_markdown: a hard break at each line's end outside fences, so the log's one
    line a step or call stays one line; fenced code and the model's Markdown render as such."""
    log = "▸ Plan\n**first** the sum\n→ calculate(6*7)\n```python\nx = 1\ny = 2\n```\n← calculate: 42\n\n✓ Final answer"
    source = markup.log_markdown(log)
    assert "x = 1\ny = 2\n```" in source  # fenced code as written: no trailing spaces
    html = markup.render_now(source, user=False)
    assert "▸ Plan<br>\n<strong>first</strong> the sum<br>\n→ calculate(6*7)" in html
    assert "<pre><code" in html and "</code></pre>" in html and "x" in html and "```" not in html
    assert "← calculate: 42</p>" in html and "<p>✓ Final answer</p>" in html
    assert markup.log_markdown("a\n~~~\nb\nb2\n~~~\nc").endswith("\n~~~\nb\nb2\n~~~\nc")  # a tilde fence too
