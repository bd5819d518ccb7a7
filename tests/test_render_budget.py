"""The render budget (chat/markup.py, chat/render_pool.py, docs/benchmarks/render-budget.md):
no text, a member's or a model's, keeps its render going past the budget; a text that
misses it is shown as written; slow renders keep no other render waiting; and ordinary
text renders exactly as before.

The budget is asserted by what the fallback does (the text shown plain, the worker
killed and replaced), not by how fast ordinary text renders.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from collab.chat import markup, render_pool
from collab.chat.markup import HIGHLIGHT_MAX_CHARS, HIGHLIGHT_MAX_LINE, LINK_OPENERS_MAX, render_now
from collab.chat.models import Message
from collab.chat.render_bench import KNOWN, documents, render_before
from collab.chat.render_pool import SHORT_CHARS
from tests.conftest import member
from tests.test_fuzz import check_rendered
from tests.test_fuzz import markdown as fuzzed_markdown

FAKE_WORKER = (sys.executable, str(Path(__file__).with_name("render_fake_worker.py")))
# Past the budget, the time a loaded machine may take to hand the fallback back: generous,
# as the renders it bounds took minutes.
GRACE_S = 3.0
LONG = "hang " + "x" * SHORT_CHARS  # the fake worker never answers it; long enough for the long lane


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


@pytest.mark.parametrize("lang", ["systemd", "zeek", "mcfunction", "easytrieve"])
def test_a_short_block_of_a_lexer_off_the_allow_list_is_plain_where_an_allowed_one_highlights(lang: str) -> None:
    """The allow-list alone, apart from the size caps (a one-line block far under them)."""
    for user in (False, True):
        assert "<span" not in render_now(f"```{lang}\n[Unit]\nDescription=x\n```", user=user)
        assert "<span" in render_now("```python\nimport os\nx = 1\n```", user=user)


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
    html = render_now(f"`before`\n\n{slow}\n\n```python\nx = 1\n```", user=True)
    assert "<code>before</code>" in html
    assert "<span" not in html
    assert html.count("<pre>") == 2


# --- what is parsed ---------------------------------------------------------------------


def test_past_so_many_brackets_links_are_plain_text() -> None:
    """markdown-it-py scans on from each `[` (~65 µs each): 8,000 of `![` took 0.7 s."""
    link = "[a](https://example.com/) "
    assert "<a href" in render_now("[" * (LINK_OPENERS_MAX - 1) + link, user=True)
    past = render_now("[" * LINK_OPENERS_MAX + link + "\n\n[r]: https://example.com/r", user=True)
    assert "<a href" not in past and "[a](https://example.com/)" in past and "[r]: https://example.com/r" in past


@given(fuzzed_markdown, st.sampled_from(["", "python", "js", "json", "bash", "sql", "html", "diff", "nosuchlang"]))
@example("look:\n```python\nx = 1\n```\nafter\n[a](/b) ![c](/d.png) ![e](https://x.example/e.png)", "ts")
def test_ordinary_text_renders_as_before(source: str, lang: str) -> None:
    """The caps change nothing below them: a text, and it in a fence, render as before."""
    text = f"{source}\n\n```{lang}\n{source}\n```\n"
    assume(text.count("[") <= LINK_OPENERS_MAX)
    for user in (False, True):
        assert render_now(text, user=user) == render_before(text, user=user)


# --- the budget, through the worker processes --------------------------------------------


@given(documents())
@example(KNOWN[0][1])
@example(KNOWN[4][1])
@example(KNOWN[6][1])
@example("```python\n" + " \n" * 25_000 + "```")  # a model's reply may be longer than a post
@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
def test_any_text_is_shown_within_the_budget(text: str) -> None:
    """Any text, pathological bodies in any lexer's fence among them: shown, safe, and
    within the budget; if the budget ran out, as written (the fallback's result)."""
    pool = render_pool.pool()
    missed = pool.outcomes["deadline"]
    start = time.monotonic()
    html = markup.render_markdown(text)
    took = time.monotonic() - start
    check_rendered(html)
    if pool.outcomes["deadline"] > missed:
        assert html == markup.plain(text)
    assert took < render_pool.budget_s() + GRACE_S


def test_the_fallback_is_the_text_as_written_escaped() -> None:
    assert markup.plain("a <b>\nc &\n\n\n  \nd\x00\ud800") == "<p>a &lt;b&gt;<br>\nc &amp;</p>\n<p>d\ufffd\ufffd</p>\n"
    assert markup.plain("") == ""
    check_rendered(markup.plain("<script>alert(1)</script>"))


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], render_pool.Pool]]:
    """Pools of the fake worker (tests/render_fake_worker.py), closed after the test.
    Every text goes to the pool meanwhile, short ones too (no text renders quickly)."""
    monkeypatch.setattr(markup, "QUICK_MAX_CHARS", -1)
    made: list[render_pool.Pool] = []

    def make(workers: int) -> render_pool.Pool:
        made.append(render_pool.Pool(workers, command=FAKE_WORKER))
        return made[-1]

    yield make
    for pool in made:
        pool.close()


def pid_of(html: str | None) -> int:
    found = re.search(r"pid=(\d+)", html or "")
    assert found is not None, html
    return int(found.group(1))


def in_a_minute() -> float:
    return time.monotonic() + 60


def test_a_render_past_its_deadline_is_cut_and_its_worker_replaced(pools: Callable[[int], render_pool.Pool]) -> None:
    pool = pools(1)
    first = pid_of(pool.submit("ok", True, in_a_minute()).result(60))
    assert pool.submit("hang", True, time.monotonic() + 0.5).result(60) is None
    assert pool.outcomes["deadline"] == 1
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)  # killed and reaped
    assert pid_of(pool.submit("ok", True, in_a_minute()).result(60)) != first


def test_a_worker_that_dies_mid_render_is_replaced(pools: Callable[[int], render_pool.Pool]) -> None:
    pool = pools(1)
    first = pid_of(pool.submit("ok", True, in_a_minute()).result(60))
    assert pool.submit("die", True, in_a_minute()).result(60) is None
    assert pool.outcomes["failed"] == 1
    assert pid_of(pool.submit("ok", True, in_a_minute()).result(60)) != first


def test_a_renderers_error_is_shown_plain_and_the_worker_kept(pools: Callable[[int], render_pool.Pool]) -> None:
    pool = pools(1)
    first = pid_of(pool.submit("ok", True, in_a_minute()).result(60))
    assert pool.submit("raise", True, in_a_minute()).result(60) is None
    assert pool.outcomes["failed"] == 1
    assert pid_of(pool.submit("ok", True, in_a_minute()).result(60)) == first


def running(futures: list[Any]) -> int:
    return sum(future.running() for future in futures)


def test_long_renders_cannot_keep_a_short_one_waiting(pools: Callable[[int], render_pool.Pool]) -> None:
    """Seven tabs' renders that never end take every worker they may, which is one of
    two: a short post is rendered meanwhile by the other, and no long one ever gets it.
    Closing the pool shows them as written."""
    pool = pools(2)
    slow = [pool.submit(LONG, True, in_a_minute()) for _ in range(7)]
    give_up = time.monotonic() + 30
    while not running(slow) and time.monotonic() < give_up:
        time.sleep(0.005)  # until a worker has taken one
    assert running(slow) == 1
    assert pool.submit("ordinary", True, in_a_minute()).result(60).startswith("<p>ordinary")
    # As conftest's assert_silent: for a while, no second long render starts.
    quiet = time.monotonic() + 0.5
    while time.monotonic() < quiet:
        assert running(slow) == 1
        time.sleep(0.01)
    assert not any(future.done() for future in slow)
    pool.close()
    assert [future.result(10) for future in slow] == [None] * 7


async def test_a_flood_of_slow_renders_keeps_no_other_waiting(
    pools: Callable[[int], render_pool.Pool], monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """Through the event loop's API, with a budget: the slow ones are shown as written at
    their deadline (queued or running); the ordinary one, asked last, is rendered first."""
    settings.COLLAB = {**settings.COLLAB, "RENDER_BUDGET_S": 5.0}
    monkeypatch.setattr(render_pool, "_pool", pools(2))
    slow = [asyncio.ensure_future(markup.arender_user_markdown(LONG)) for _ in range(7)]
    await asyncio.sleep(0)  # each task asks for its render (before its first wait)
    ordinary = await markup.arender_user_markdown("an ordinary post")
    assert ordinary.startswith("<p>an ordinary post")
    assert not any(task.done() for task in slow)
    assert await asyncio.gather(*slow) == [markup.plain(LONG)] * 7


def test_a_render_from_a_thread_falls_back_at_the_deadline(
    pools: Callable[[int], render_pool.Pool], monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """The sync API (what callers' sync_to_async runs) waits no longer than the budget."""
    monkeypatch.setattr(render_pool, "_pool", pools(1))
    settings.COLLAB = {**settings.COLLAB, "RENDER_BUDGET_S": 0.5}
    assert markup.render_markdown("hang **on**") == "<p>hang **on**</p>\n"
    settings.COLLAB = {**settings.COLLAB, "RENDER_BUDGET_S": 60.0}  # its new worker may start slowly
    assert markup.render_markdown("**ok**").startswith("<p>**ok** pid=")


async def test_seven_tabs_of_slow_renders_keep_no_other_post_waiting(
    world: Any, pools: Callable[[int], render_pool.Pool], monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """Over the post path: seven of alice's tabs post texts whose render never ends; bob's
    ordinary post, sent after them, is shown first and rendered; alice's are stored and
    shown as written, at their deadline."""
    settings.COLLAB = {**settings.COLLAB, "RENDER_BUDGET_S": 5.0}
    monkeypatch.setattr(render_pool, "_pool", pools(2))
    async with contextlib.AsyncExitStack() as stack:
        bob = await stack.enter_async_context(member(world.bob))
        tabs = [await stack.enter_async_context(member(world.alice)) for _ in range(7)]
        for tab in tabs:
            await tab.post(LONG)
        await bob.post("an ordinary post")
        frames = await bob.until(lambda f: sum(r.role == "user" for r in f.replies.values()) == 8, timeout=30)
    shown = [r for r in frames.replies.values() if r.role == "user"]  # in the order they came
    assert [r.author for r in shown] == ["bob"] + ["alice"] * 7
    stored = await database_sync_to_async(
        lambda: list(Message.objects.order_by("seq").values_list("author_name", "html"))
    )()
    assert stored[0][0] == "bob" and stored[0][1].startswith("<p>an ordinary post pid=")
    assert stored[1:] == [("alice", markup.plain(LONG))] * 7


@pytest.mark.parametrize(
    ("text", "quick"),
    [
        ("what is 2+2? **bold**, `code`, a [link](https://example.com)", True),
        ("x" * markup.QUICK_MAX_CHARS, True),
        ("x" * (markup.QUICK_MAX_CHARS + 1), False),
        ("```python\nprint(1)\n```", False),  # a fence: a lexer would run
        ("~~~\ncode\n~~~", False),
        ("[" * (markup.QUICK_MAX_OPENERS + 1), False),
    ],
)
async def test_only_short_texts_without_a_fence_render_in_this_process(
    pools: Callable[[int], render_pool.Pool], monkeypatch: pytest.MonkeyPatch, text: str, quick: bool
) -> None:
    """A quick text never reaches the pool (whose fake worker would answer with its pid);
    the others all do, whichever function renders them."""
    monkeypatch.undo()  # the fixture's "nothing is quick"
    monkeypatch.setattr(render_pool, "_pool", pools(1))
    assert markup.renders_quickly(text) is quick
    got = [markup.render_markdown(text), markup.render_user_markdown(text), await markup.arender_markdown(text)]
    if quick:
        assert got == [render_now(text, user=False), render_now(text, user=True), render_now(text, user=False)]
    else:
        assert all(" pid=" in html for html in got), got
    # A post from the event loop always goes to a worker (markup.arender_user_markdown).
    assert " pid=" in await markup.arender_user_markdown(text)
