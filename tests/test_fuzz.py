"""Property tests (hypothesis) on what a client controls: its WebSocket frames
(commands.parse_action), the message it posts (posting.check_post) and the Markdown every
member's browser renders (markup.render_markdown).

Two budgets: the default ("quick", a few seconds, what `make test` and CI run) and
`HYPOTHESIS_PROFILE=long` (README "Testing"). Examples that failed once are replayed
first from .hypothesis/ (not in git).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from html.parser import HTMLParser
from typing import Any

import pytest
from django.conf import settings
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from collab.chat.commands import COMMANDS
from collab.chat.commands import parse_action as parse_frame
from collab.chat.errors import ClientError
from collab.chat.markup import render_markdown
from collab.chat.replies.posting import check_post

ACTIONS = tuple(COMMANDS)

hypothesis_settings.register_profile(
    "quick", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.register_profile(
    "long", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))

FRAME_CODES = {"frame.malformed", "frame.too_large", "action.unknown"}
POST_CODES = {
    "message.invalid",
    "message.empty",
    "message.invalid_text",
    "message.too_long",
    "message.invalid_client_id",
}

# --- strategies -------------------------------------------------------------------------

# Every code point, lone surrogates included (text() leaves them out), and a few
# that break naive code often enough to be drawn on purpose.
ODD = ["\x00", "\ud800", "\udfff", "\ud83d", "\u202e", "\u200b", "\ufeff", "\U0001f600", "\u0301", "\r", "\u2028"]
chars = st.characters(exclude_categories=()) | st.sampled_from(ODD)
any_text = st.text(chars)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and the infinities too: json.dumps writes them, json.loads reads them
    | any_text
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(any_text, inner, max_size=5),
    max_leaves=30,
)
uuid_like = st.uuids().flatmap(
    lambda u: st.sampled_from(
        [str(u), str(u).upper(), u.hex, "{" + str(u) + "}", "urn:uuid:" + str(u), " " + str(u) + " ", str(u)[:-1]]
    )
)


@st.composite
def deep(draw: st.DrawFn) -> Any:
    """JSON text nested up to far beyond any recursion limit; as a frame or inside one."""
    depth = draw(st.integers(0, 40_000))
    opening, closing = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ("[[", "]]")]))
    inner = opening * depth + draw(st.sampled_from(["1", '""', "null", "[]"])) + closing * depth
    where = draw(st.sampled_from(["{{}}", '{{"action": {}}}', '{{"text": "hi", "client_id": {}}}', '{{"text": {}}}']))
    return inner if where == "{{}}" else where.format(inner)


def frame_objects() -> st.SearchStrategy[dict[str, Any]]:
    """Objects shaped like real frames: the known keys with right and wrong values."""
    return st.fixed_dictionaries(
        {},
        optional={
            "action": st.sampled_from([*ACTIONS, "", "POST", "remove", "post\x00"]) | json_values,
            "text": any_text | json_values,
            "client_id": uuid_like | json_values,
            "message_id": st.integers() | json_values,
            "HEADERS": st.dictionaries(any_text, any_text, max_size=3),
        },
    )


def encoded(values: st.SearchStrategy[Any]) -> st.SearchStrategy[str]:
    """As json.dumps writes them: ASCII escapes (surrogates as \\udXXX) or raw characters."""
    return st.tuples(values, st.booleans()).map(lambda pair: json.dumps(pair[0], ensure_ascii=pair[1]))


@st.composite
def sized(draw: st.DrawFn) -> str:
    """A valid post frame of about the size limit, on either side of it."""
    limit = settings.COLLAB["MAX_FRAME_BYTES"]
    shell = json.dumps({"text": ""})
    size = draw(st.integers(limit - 50, limit + 50))
    fill = draw(st.sampled_from(["a", "\u00e9", "\ud800"]))
    return shell[:-2] + fill * max(0, size - len(shell)) + shell[-2:]


frames = (
    st.none()
    | any_text
    | encoded(json_values)
    | encoded(frame_objects())
    | deep()
    | sized()
    | st.integers(4290, 4400).map(lambda n: '{"action": ' + "9" * n + "}")  # past int() digit limits
)


# --- parse_frame and check_post -----------------------------------------------------------


def check_frame(frame: str | None) -> tuple[str, dict[str, Any]] | None:
    try:
        action, content = parse_frame(frame)
    except ClientError as exc:
        assert exc.code in FRAME_CODES, exc.code
        return None
    assert action in ACTIONS
    assert isinstance(content, dict)
    return action, content


def check_message(text: object, client_id: object) -> None:
    try:
        clean, parsed = check_post(text, client_id)
    except ClientError as exc:
        assert exc.code in POST_CODES, exc.code
        return
    assert isinstance(clean, str)
    assert clean == clean.strip() and clean
    assert len(clean) <= settings.COLLAB["MAX_MESSAGE_CHARS"]
    assert "\x00" not in clean
    assert not any("\ud800" <= c <= "\udfff" for c in clean)
    clean.encode("utf-8")  # storable: PostgreSQL and SQLite take it
    assert parsed is None or isinstance(parsed, uuid.UUID)
    if client_id in (None, ""):
        assert parsed is None


@given(frames)
def test_a_frame_parses_to_an_action_or_a_known_client_error(frame: str | None) -> None:
    check_frame(frame)


@given(frames)
def test_a_post_frame_goes_through_check_post_as_the_consumer_sends_it(frame: str | None) -> None:
    parsed = check_frame(frame)
    if parsed is not None and parsed[0] == "post":
        check_message(parsed[1].get("text"), parsed[1].get("client_id"))


@given(any_text | json_values, uuid_like | json_values | st.uuids())
def test_check_post_returns_clean_text_and_a_uuid_or_a_known_client_error(text: object, client_id: object) -> None:
    check_message(text, client_id)


@given(
    st.integers(0, 200),
    st.text(st.sampled_from(" \t\n\r\u00a0\u3000x")),
    st.sampled_from(["x", "\u00e9", "\U0001f600"]),
)
def test_check_post_measures_the_stripped_text_against_the_limit(pad: int, edges: str, fill: str) -> None:
    limit = settings.COLLAB["MAX_MESSAGE_CHARS"]
    body = fill * (limit - 100 + pad)  # around the limit, by up to 100 either way
    check_message(edges + body + edges, None)


def test_a_real_post_frame_passes() -> None:
    """The properties above could hold by refusing everything; this frame must pass."""
    cid = str(uuid.uuid4())
    action, content = parse_frame(json.dumps({"text": "  hi @a  ", "client_id": cid, "HEADERS": {}}))
    assert action == "post"
    assert check_post(content["text"], content["client_id"]) == ("hi @a", uuid.UUID(cid))


# --- render_markdown ----------------------------------------------------------------------

FRAGMENTS = [
    "<script>alert(1)</script>", "<SCRIPT SRC=//evil.example/x.js>", "<scr<script>ipt>", "</script>",
    "<img src=x onerror=alert(1)>", "<img src=/ok.png>", "<svg onload=alert(1)>", "<a href=javascript:alert(1)>x</a>",
    '<div onclick="alert(1)">', "<iframe src=//evil.example>", "<style>*{}</style>", "<!--", "-->", "<![CDATA[",
    "![a](http://evil.example/x.png)", "![a](//evil.example/x.png)", "![a](/\\evil.example/x.png)",
    "![a](/ok.png)", "![a](/ok.png \"t\")", "![a](</\t/evil>)", "![a](&#47;/evil)", "![a](javascript:alert(1))",
    "![a][r]", "[a][r]", "[r]: //evil.example/x.png", "[r]: javascript:alert(1)", "[r]: /ok.png",
    "[x](javascript:alert(1))", "[x](JaVaScRiPt:alert(1))", "[x](java\tscript:alert(1))",
    "[x](&#106;avascript:alert(1))", "[x](javascript&#58;alert(1))", "[x](data:text/html,<script>)",
    "[x](vbscript:msgbox)", "<javascript:alert(1)>", "<http://evil.example>", "[x](</x y>)",
    "```html\n<script>alert(1)</script>\n```\n", "```js\nalert(1)\n```\n", "```\"><script>\nx\n```\n",
    "`<img src=x onerror=alert(1)>`", "| a | b |\n|:-|-:|\n| <script> | x |\n", '" onmouseover="alert(1)',
    "' onfocus='alert(1)", "onerror=", "javascript:", "&lt;script&gt;", "&#60;script&#62;", "\\<script>",
    "**", "_", "*", "`", "~~", "> ", "- ", "1. ", "# ", "\n", "\n\n", " ", "(", ")", "[", "]", "!", "<", ">", '"', "'",
]  # fmt: skip
markdown = st.lists(st.sampled_from(FRAGMENTS) | any_text, max_size=12).map("".join)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, attrs))

    handle_startendtag = handle_starttag


def tags(html: str) -> list[tuple[str, list[tuple[str, str | None]]]]:
    parser = _Tags()
    parser.feed(html)
    parser.close()
    return parser.found


# What a browser ignores inside a URL (WHATWG URL: tab and newlines anywhere, C0 controls
# and spaces at the ends): "/\t/evil" is "//evil" to it.
_URL_IGNORED = re.compile(r"[\t\n\r]")


def as_browser_reads(url: str) -> str:
    return _URL_IGNORED.sub("", url).strip("\x00- ").lower()


def on_this_site(src: str) -> bool:
    url = as_browser_reads(src)
    return url.startswith("/") and not url.startswith(("//", "/\\"))


def check_rendered(html: str) -> None:
    html.encode("utf-8")  # it goes out in a WebSocket text frame
    assert "<script" not in html.lower()
    assert not re.search(r"<[^>]*\son[a-z]+\s*=", html, re.I), html
    for tag, attrs in tags(html):
        assert tag != "script"
        for name, value in attrs:
            assert not name.startswith("on"), (tag, name)
            url = as_browser_reads(value or "")
            if name in ("href", "src"):
                assert not url.startswith(("javascript:", "vbscript:", "data:")), (tag, name, value)
        if tag == "img":
            src = dict(attrs).get("src") or ""
            assert on_this_site(src), src


@given(markdown)
@example("\ud800")  # found by the long profile: nh3 raised UnicodeEncodeError (a reply's text can hold one)
def test_rendered_markdown_has_no_script_handler_javascript_url_or_foreign_image(source: str) -> None:
    check_rendered(render_markdown(source))


@given(st.sampled_from(["/", "//", "/\\", "/\t/", "http://", "https://", "javascript:", " /", "\\\\"]), any_text)
def test_an_image_shows_only_from_this_site(prefix: str, rest: str) -> None:
    check_rendered(render_markdown(f"![alt]({prefix}{rest})"))
    check_rendered(render_markdown(f"![alt](<{prefix}{rest}>)"))


@pytest.mark.parametrize(
    ("source", "shown"),
    [("![a](/media/a.png)", True), ("![a](https://evil.example/a.png)", False), ("![a](//evil.example/a.png)", False)],
)
def test_the_image_check_tells_local_from_foreign(source: str, shown: bool) -> None:
    """The property above could pass by showing no image at all: a local one is shown."""
    imgs = [attrs for tag, attrs in tags(render_markdown(source)) if tag == "img"]
    assert bool(imgs) == shown
