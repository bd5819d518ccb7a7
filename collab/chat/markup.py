"""Markdown -> sanitised HTML, for user messages and finished replies, within a time budget.

markdown-it-py's "js-default" preset escapes raw HTML and refuses javascript: links;
nh3 (ammonia) then sanitises the result anyway, so a parser bug cannot become XSS.
Fenced code is highlighted by Pygments into <span class> markup that nh3 keeps. A
person's message has a dialect of its own (as_typed: what they typed shows, every
character; docs/wire.md, "shown as typed"); a model's reply, all of Markdown.

A text is input whoever wrote it (a member, or a model that a member can steer), and some
texts cost far more than their length: some Pygments lexers are cubic on a line of spaces
(`systemd`: 6 minutes for 4,000 characters), common ones quadratic on some shapes
(`python` on blank lines, `javascript` on escaped quotes), and markdown-it-py spends ~65 µs
on each `[` that no `]` closes. So, from the inside out (docs/benchmarks/render-budget.md):

- only lexers of an allow-list highlight, only up to HIGHLIGHT_MAX_CHARS a block (in lines
  of HIGHLIGHT_MAX_LINE) and HIGHLIGHT_TOTAL_CHARS a text, and highlighting stops (the rest
  of the code plain) once a text's has taken HIGHLIGHT_BUDGET_S;
- a text with more than LINK_OPENERS_MAX `[` is parsed without links and images;
- the public functions render in a worker process (render_pool.py) that is killed at the
  render budget (settings.COLLAB["RENDER_BUDGET_S"]), and a text that misses it is shown
  as written, escaped (plain()): stored and shown, never lost, never late. Only a short
  text with no fence and few `[` (renders_quickly) is rendered in the caller's process,
  except a person's post from the event loop (arender_user_markdown).

render_now() is the renderer itself, in this process: the worker's, the benchmark's.
"""

from __future__ import annotations

import functools
import html as html_lib
import re
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import nh3
from markdown_it import MarkdownIt
from markdown_it.token import Token
from pygments import format as pygments_format
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name

from collab.chat import render_pool

_formatter = HtmlFormatter(nowrap=True)

# What a fence's first word may name, and the Pygments lexer it gets: the languages a team
# pastes. Any other is shown as escaped plain code. Each lexer here was searched with
# `python -m collab.chat.render_bench --lexers` (pathological bodies); the quadratic ones that
# search found (python, javascript...) are bounded by the caps below, and a lexer that is
# cubic on one line (systemd, zeek, mcfunction, easytrieve) is not here at all.
LEXERS: dict[str, str] = {
    **dict.fromkeys(["python", "py", "python3", "py3", "gyp"], "python"),
    **dict.fromkeys(["pycon"], "pycon"),
    **dict.fromkeys(["pytb", "traceback"], "pytb"),
    **dict.fromkeys(["javascript", "js", "mjs", "cjs", "node"], "javascript"),
    **dict.fromkeys(["jsx"], "jsx"),
    **dict.fromkeys(["typescript", "ts"], "typescript"),
    **dict.fromkeys(["tsx"], "tsx"),
    **dict.fromkeys(["json", "jsonc", "json5", "jsonl", "ndjson"], "json"),
    **dict.fromkeys(["yaml", "yml"], "yaml"),
    **dict.fromkeys(["toml"], "toml"),
    **dict.fromkeys(["bash", "sh", "shell", "zsh", "ksh"], "bash"),
    **dict.fromkeys(["console", "shell-session", "terminal"], "console"),
    **dict.fromkeys(["sql"], "sql"),
    **dict.fromkeys(["postgresql", "postgres", "pgsql"], "postgresql"),
    **dict.fromkeys(["mysql"], "mysql"),
    **dict.fromkeys(["html", "htm", "xhtml"], "html"),
    **dict.fromkeys(["xml", "svg", "xsd", "xsl", "plist"], "xml"),
    **dict.fromkeys(["css"], "css"),
    **dict.fromkeys(["scss"], "scss"),
    **dict.fromkeys(["c", "h"], "c"),
    **dict.fromkeys(["cpp", "c++", "cc", "cxx", "hpp", "hh", "hxx"], "cpp"),
    **dict.fromkeys(["java"], "java"),
    **dict.fromkeys(["go", "golang"], "go"),
    **dict.fromkeys(["rust", "rs"], "rust"),
    **dict.fromkeys(["ruby", "rb"], "ruby"),
    **dict.fromkeys(["php"], "php"),
    **dict.fromkeys(["kotlin", "kt", "kts"], "kotlin"),
    **dict.fromkeys(["swift"], "swift"),
    **dict.fromkeys(["csharp", "cs", "c#"], "csharp"),
    **dict.fromkeys(["diff", "patch", "udiff"], "diff"),
    **dict.fromkeys(["markdown", "md"], "markdown"),
    **dict.fromkeys(["dockerfile", "docker", "containerfile"], "docker"),
    **dict.fromkeys(["ini", "cfg", "dosini", "conf"], "ini"),
    **dict.fromkeys(["lua"], "lua"),
    **dict.fromkeys(["perl", "pl"], "perl"),
    **dict.fromkeys(["r"], "splus"),
    **dict.fromkeys(["scala"], "scala"),
    **dict.fromkeys(["haskell", "hs"], "haskell"),
    **dict.fromkeys(["powershell", "ps1", "pwsh"], "powershell"),
    **dict.fromkeys(["makefile", "make", "mk"], "make"),
    **dict.fromkeys(["nginx"], "nginx"),
    **dict.fromkeys(["graphql", "gql"], "graphql"),
    **dict.fromkeys(["elixir", "ex", "exs"], "elixir"),
    **dict.fromkeys(["dart"], "dart"),
    **dict.fromkeys(["protobuf", "proto"], "protobuf"),
    **dict.fromkeys(["terraform", "tf", "hcl"], "terraform"),
    **dict.fromkeys(["text", "txt", "plain", "plaintext"], "text"),
}
# Options a lexer of the list needs: Markdown's would highlight the fences inside it with
# *any* lexer, the cubic ones too.
_LEXER_OPTIONS: dict[str, dict[str, Any]] = {"markdown": {"handlecodeblocks": False}}

# Highlighting costs 3-13 µs a character (lexing and formatting; dense code the most):
# 20,000 in a block and 50,000 in a text keep a long reply's under a second. Some lexers
# are quadratic within one line (console's prompt on a long line), which no check between
# tokens can stop: a block with a line past HIGHLIGHT_MAX_LINE is not highlighted. Others
# are quadratic across lines (python's blank lines), token by token: the time cap stops them.
HIGHLIGHT_MAX_CHARS = 20_000
HIGHLIGHT_TOTAL_CHARS = 50_000
HIGHLIGHT_MAX_LINE = 1_000
HIGHLIGHT_BUDGET_S = 1.0
# markdown-it-py looks for the `]` of every `[` up to its nesting limit (~65 µs each with
# none): past this many, a text's brackets are plain text (no links, no images). A person's
# 8,000 characters hardly hold a hundred links.
LINK_OPENERS_MAX = 1_000


@functools.lru_cache(maxsize=len(LEXERS))
def _lexer(alias: str) -> Lexer:
    """A lexer per language, made once: finding and making one cost more than many a
    short block's highlighting. Lexers keep no state between texts (shared by threads)."""
    return get_lexer_by_name(alias, **_LEXER_OPTIONS.get(alias, {}))


class _OutOfTime(Exception):
    """A text's highlighting took its time: the rest of its code is shown plain."""


class _Quota(threading.local):
    """What one render may still highlight (render_now sets it; a thread each)."""

    chars = 0
    stop_at = 0.0


_quota = _Quota()


def _timed(tokens: Iterable[tuple[Any, str]]) -> Iterator[tuple[Any, str]]:
    # Checked at every token (~60 ns, a few hundred µs a long text): a token of a capped
    # line costs at most ~0.1 s, and many can come between two cheap ones.
    stop_at = _quota.stop_at
    for token in tokens:
        if time.monotonic() > stop_at:
            raise _OutOfTime
        yield token


def _longest_line(code: str) -> int:
    return max(map(len, code.split("\n")))


def _highlight(code: str, lang: str, _attrs: str) -> str:
    alias = LEXERS.get(lang.strip().split()[0].lower()) if lang.strip() else None
    if alias is None or len(code) > min(HIGHLIGHT_MAX_CHARS, _quota.chars) or _longest_line(code) > HIGHLIGHT_MAX_LINE:
        return html_lib.escape(code)
    _quota.chars -= len(code)
    try:
        return str(pygments_format(_timed(_lexer(alias).get_tokens(code)), _formatter))
    except _OutOfTime:
        _quota.chars = 0  # nor any later block of this text
        return html_lib.escape(code)


_OPTIONS = {"highlight": _highlight, "linkify": False, "typographer": False}


def _parser(user: bool, links: bool) -> MarkdownIt:
    md = MarkdownIt("js-default", {**_OPTIONS, "breaks": user}).enable("table")
    md.add_render_rule("image", _image)
    if user:
        as_typed(md)
    else:
        md.core.ruler.push("steer_marks", _steer_marks)
    if not links:  # the reference definitions go too: they show as written
        md.disable(["link", "image", "reference"])
    return md


# How the marker a steered reply's text holds where a member steered it begins (chat/steer.py;
# docs/wire.md, "steer a reply"): a paragraph of its own, "↪ steered by NAME: NOTE".
STEER_MARK = "\u21aa steered by "


def _steer_marks(state: Any) -> None:
    """A reply's paragraph that begins with STEER_MARK is shown as a marker: its text in
    `<span class="steer-mark">` (a class nh3 keeps on a span)."""
    tokens = state.tokens
    for i in range(1, len(tokens)):
        token = tokens[i]
        if token.type == "inline" and tokens[i - 1].type == "paragraph_open" and token.content.startswith(STEER_MARK):
            opened, closed = Token("html_inline", "", 0), Token("html_inline", "", 0)
            opened.content, closed.content = '<span class="steer-mark">', "</span>"
            token.children = [opened, *(token.children or []), closed]


# A person's message is what they typed, with only the Markdown people mean in a chat:
# code spans and fences, links and autolinks, lists, quotes, paragraphs and line breaks.
# Nothing that takes characters away: no emphasis, strong or strikethrough (`17*23`,
# `snake_case_name`, `**not bold**`, `~~x~~` stay as typed), no headings (`# 3 today`)
# nor rules (`---`), no tables, no entities (`&copy;` stays `&copy;`). A backslash goes
# only where it stops something this dialect does (as_typed_escape); elsewhere it is
# shown, as typed. A model's Markdown keeps every rule.
_NOT_TYPED = ["emphasis", "strikethrough", "heading", "lheading", "hr", "table", "entity"]
# What a backslash stops anywhere in a person's text: a code span, a link, an autolink
# (and, before `![`, an image); at a line's start: a list item or a quote.
_ESCAPES_INLINE = frozenset("`[]<")
_ESCAPES_LINE_START = frozenset("-+*>")
_MARKERS = _ESCAPES_LINE_START | frozenset(".)")  # `1.` and `1)` begin an ordered list item
_MARKER_REACH = 12  # an ordered list's number has at most 9 digits; a line's indent, a few spaces


def as_typed(md: MarkdownIt) -> MarkdownIt:
    """`md` made into the dialect of people's messages (above)."""
    md.disable(_NOT_TYPED)
    md.inline.ruler.at("escape", as_typed_escape)
    return md


def as_typed_escape(state: Any, silent: bool) -> bool:
    """markdown-it's escape rule for people: `\\[` shows `[` (no link), `\\-` at a line's start
    shows `-` (no list item), `1\\.` there shows `1.`; `\\*`, `\\_`, `\\#` and any other keep
    their backslash, as typed; `\\\\` is shown whole and escapes nothing after it."""
    src, pos = state.src, state.pos
    if src[pos] != "\\" or pos + 1 >= state.posMax:
        return False
    after = src[pos + 1]
    if after == "!" and src.startswith("[", pos + 2):  # `\\![alt](url)`: no image, nor a link
        if not silent:
            state.push("text_special", "", 0).content = "!["
        state.pos = pos + 3
        return True
    stops = after in _ESCAPES_INLINE
    if not stops and after in _MARKERS:
        # What the line holds before the backslash, looked for within a list marker's
        # reach only (linear in the text, however many backslashes it holds).
        before = src[max(0, pos - _MARKER_REACH) : pos]
        line = before.rsplit("\n", 1)[-1].strip()
        starts = "\n" in before or pos <= _MARKER_REACH
        stops = starts and (not line if after in _ESCAPES_LINE_START else line.isdigit())
    if not stops and after != "\\":
        return False  # the backslash is text, and what follows it is parsed as ever
    if not silent:
        state.push("text_special", "", 0).content = after if stops else "\\\\"
    state.pos = pos + 2
    return True


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


# People's messages keep their line breaks (Shift+Enter in the box): a single newline is a
# <br>, as in every chat, and their own dialect (as_typed). A model's Markdown keeps the
# usual rules (a newline is a space). Indexed by (user, links).
_PARSERS = {(user, links): _parser(user, links) for user in (False, True) for links in (False, True)}

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


# A text this short, with no fence and few `[`, is rendered here rather than by a worker:
# no lexer runs, and markdown-it's cost is bounded by its length and its `[` (at most
# ~5 ms for the worst shape measured, typically under 1 ms), less than a worker's round
# trip costs the two processes (docs/benchmarks/2026-12-05.md#b-quiet-before-after).
QUICK_MAX_CHARS = 500
QUICK_MAX_OPENERS = 8


def renders_quickly(text: str) -> bool:
    """Whether `text` is rendered in this process: short, no fence (``` or ~~~, where a
    lexer would run) and at most QUICK_MAX_OPENERS `[`."""
    return (
        len(text) <= QUICK_MAX_CHARS
        and "```" not in text
        and "~~~" not in text
        and text.count("[") <= QUICK_MAX_OPENERS
    )


def render_markdown(text: str) -> str:
    """Sanitised HTML for `text` (an assistant's reply), within the render budget.
    Safe to mark safe in a template. Blocks its thread up to the budget: from the event
    loop, await arender_markdown instead."""
    return _render(text, user=False)


def render_user_markdown(text: str) -> str:
    """Sanitised HTML for a person's message: Markdown whose line breaks are kept."""
    return _render(text, user=True)


def _render(text: str, *, user: bool) -> str:
    if renders_quickly(text):
        return render_now(text, user=user)
    html = render_pool.render(text, user=user)
    return plain(text) if html is None else html


async def arender_markdown(text: str) -> str:
    """render_markdown for the event loop: holds no thread of the loop's executor while
    the worker renders, so slow renders cannot keep other work waiting for one."""
    if renders_quickly(text):
        return render_now(text, user=False)
    html = await render_pool.arender(text, user=False)
    return plain(text) if html is None else html


async def arender_user_markdown(text: str) -> str:
    """render_user_markdown for the event loop (see arender_markdown). Always in a
    worker, short posts too: while it renders, the post's early model requests go out
    before the database thread takes the GIL to store the post (rendered here, the added
    first token doubled: docs/benchmarks/2026-12-05.md#b-quiet-before-after)."""
    html = await render_pool.arender(text, user=True)
    return plain(text) if html is None else html


def render_now(text: str, *, user: bool, highlight_s: float = HIGHLIGHT_BUDGET_S) -> str:
    """The render itself, in this thread: bounded by the caps above, not by the budget.
    `highlight_s`: the time its highlighting may take (a worker gives it less when the
    budget it was given is nearly spent)."""
    text = _LONE_SURROGATE.sub("\ufffd", text)
    _quota.chars = HIGHLIGHT_TOTAL_CHARS
    _quota.stop_at = time.monotonic() + highlight_s
    return _clean(_PARSERS[user, text.count("[") <= LINK_OPENERS_MAX].render(text))


_BR = "<br>\n"


_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")


def log_markdown(log: str) -> str:
    """An agent's run log (chat/agent.py: one step or call a line, and the model's own
    Markdown) as Markdown that keeps its lines: a hard break (two trailing spaces) at the
    end of every line followed by another, outside fenced code."""
    lines, fence = log.split("\n"), ""
    out = []
    for i, line in enumerate(lines):
        opened = _FENCE.match(line)
        if fence:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = ""
        elif opened:
            fence = opened.group(1)
        elif line.strip() and i + 1 < len(lines) and lines[i + 1].strip():
            line += "  "
        out.append(line)
    return "\n".join(out)


def plain(text: str) -> str:
    """`text` as written, escaped, a paragraph per run of lines and a <br> per newline:
    what a render that missed its budget shows. Linear in the text, whatever it holds."""
    text = _LONE_SURROGATE.sub("\ufffd", text.replace("\x00", "\ufffd").replace("\r\n", "\n"))
    paragraphs: list[list[str]] = [[]]
    for line in text.split("\n"):
        if line.strip():
            paragraphs[-1].append(html_lib.escape(line))
        elif paragraphs[-1]:
            paragraphs.append([])
    return "".join(f"<p>{_BR.join(lines)}</p>\n" for lines in paragraphs if lines)


def _clean(raw: str) -> str:
    return nh3.clean(
        raw,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
        filter_style_properties={"text-align"},
    )
