"""Markdown -> sanitised HTML, for user messages and finished replies.

markdown-it-py's "js-default" preset escapes raw HTML and refuses javascript: links;
nh3 (ammonia) then sanitises the result anyway, so a parser bug cannot become XSS.
Fenced code is highlighted by Pygments into <span class> markup that nh3 keeps.
"""

from __future__ import annotations

import functools
import html as html_lib
import re
from typing import Any

import nh3
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

_formatter = HtmlFormatter(nowrap=True)


@functools.lru_cache(maxsize=128)
def _lexer(name: str) -> Lexer | None:
    """A lexer per language, made once: finding and making one cost more than many a
    short block's highlighting. Lexers keep no state between texts (shared by threads)."""
    try:
        return get_lexer_by_name(name)
    except ClassNotFound:
        return None


def _highlight(code: str, lang: str, _attrs: str) -> str:
    lexer = _lexer(lang.strip().split()[0]) if lang.strip() else None
    if lexer is None:
        return html_lib.escape(code)
    return highlight(code, lexer, _formatter)


_OPTIONS = {"highlight": _highlight, "linkify": False, "typographer": False}
_md = MarkdownIt("js-default", _OPTIONS).enable("table")
# People's messages keep their line breaks (Shift+Enter in the box): a single newline is a
# <br>, as in every chat. A model's Markdown keeps the usual rule (a newline is a space).
_md_user = MarkdownIt("js-default", {**_OPTIONS, "breaks": True}).enable("table")


def _image(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    """An image from this site is shown; any other becomes a link to it. A remote image
    would load in every member's browser with no click: a beacon, and a way for a
    prompt-injected model to leak room text in its URL."""
    token = tokens[idx]
    src = str(token.attrGet("src") or "")
    alt = self.renderInlineAsText(token.children or [], options, env)
    if src.startswith("/") and not src.startswith("//"):
        return f'<img src="{html_lib.escape(src)}" alt="{html_lib.escape(alt)}">'
    return f'<a href="{html_lib.escape(src)}">{html_lib.escape(alt or "image")}</a>'


_md.add_render_rule("image", _image)
_md_user.add_render_rule("image", _image)

_TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del", "s", "code", "pre",
    "blockquote", "ul", "ol", "li", "a", "span", "table", "thead", "tbody", "tr", "th", "td", "img",
}  # fmt: skip
_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title"},
    "code": {"class"},
    "span": {"class"},
    "th": {"style"},
    "td": {"style"},
    "ol": {"start"},
}


# A lone surrogate is no Unicode text (a model's stream can hold one, JSON-escaped): nh3
# refuses it with UnicodeEncodeError. Shown as U+FFFD, the replacement character.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def render_markdown(text: str) -> str:
    """Sanitised HTML for `text` (an assistant's reply). Safe to mark safe in a template."""
    return _clean(_md.render(_LONE_SURROGATE.sub("\ufffd", text)))


def render_user_markdown(text: str) -> str:
    """Sanitised HTML for a person's message: Markdown whose line breaks are kept."""
    return _clean(_md_user.render(_LONE_SURROGATE.sub("\ufffd", text)))


def _clean(raw: str) -> str:
    return nh3.clean(
        raw,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
        filter_style_properties={"text-align"},
    )
