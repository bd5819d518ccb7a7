"""The render budget (chat/markup.py): what is highlighted and parsed is capped."""

from __future__ import annotations

import pytest

from collab.chat import markup
from collab.chat.markup import HIGHLIGHT_MAX_CHARS, HIGHLIGHT_MAX_LINE, LINK_OPENERS_MAX, render_now


def systemd_post(lang: str = "systemd") -> tuple[str, str]:
    """The defect's text at a post's cap (8,000 characters) and what it must show."""
    body = " " * (8_000 - len(f"```{lang}\n") - len("x\n```")) + "x"
    return f"```{lang}\n{body}\n```", f'<pre><code class="language-{lang}">{body}\n</code></pre>\n'


# --- what is highlighted ----------------------------------------------------------------


@pytest.mark.parametrize("lang", ["systemd", "zeek", "mcfunction", "easytrieve"])
def test_a_lexer_that_can_be_cubic_highlights_nothing(lang: str) -> None:
    """`systemd` took 367 s on a line of 4,000 spaces: off the allow-list, shown plain."""
    text, shown = systemd_post(lang)
    assert markup.render_user_markdown(text) == shown


@pytest.mark.parametrize("name", sorted(markup.LEXERS))
def test_each_name_of_the_allow_list_has_its_lexer(name: str) -> None:
    lexer = markup._lexer(markup.LEXERS[name])
    assert (type(lexer).__name__ == "TextLexer") == (markup.LEXERS[name] == "text")


def test_markdowns_lexer_leaves_the_fences_inside_it_alone() -> None:
    """Markdown's lexer would highlight a fence inside it with any lexer, systemd's too."""
    html = render_now("````markdown\n```systemd\n" + " " * 3_000 + "x\n```\n````", user=True)
    assert "x\n```" in html and html.count("<span") < 10


def test_code_past_the_caps_is_shown_plain() -> None:
    def render(text: str) -> str:
        return render_now(text, user=True, highlight_s=60)  # the caps of size alone, however slow the machine

    line = "x = 1\n"
    block = line * (HIGHLIGHT_MAX_CHARS // len(line))
    assert '<span class="n">x</span>' in render(f"```python\n{block}```")
    assert "<span" not in render(f"```python\n{block}{line}```")
    assert "<span" not in render(f"```python\nx = {'1' * HIGHLIGHT_MAX_LINE}\n```")
    # 50,000 characters a text: two blocks of ~20,000 are highlighted, the third is not.
    three = render(f"```python\n{block}```\n\n" * 3).split("<pre>")[1:]
    assert ["<span" in html for html in three] == [True, True, False]


def test_highlighting_that_takes_too_long_stops_and_the_rest_is_plain() -> None:
    """Python's lexer is quadratic on blank lines (~17 s for 20,000 characters): stopped
    at its time cap, the code is shown plain, this text's later code too, and its Markdown
    is rendered."""
    slow = "```python\n" + " \n" * 9_990 + "```"
    html = render_now(f"**before**\n\n{slow}\n\n```python\nx = 1\n```", user=True)
    assert "<strong>before</strong>" in html
    assert "<span" not in html
    assert html.count("<pre>") == 2


# --- what is parsed ---------------------------------------------------------------------


def test_past_so_many_brackets_links_are_plain_text() -> None:
    """markdown-it-py scans on from each `[` (~65 µs each): 8,000 of `![` took 0.7 s."""
    link = "[a](https://example.com/) "
    assert "<a href" in render_now("[" * (LINK_OPENERS_MAX - 1) + link, user=True)
    past = render_now("[" * LINK_OPENERS_MAX + link + "\n\n[r]: https://example.com/r", user=True)
    assert "<a href" not in past and "[a](https://example.com/)" in past and "[r]: https://example.com/r" in past
