"""Threads on two real server processes (docs/wire.md, "threads"): a post in a thread on
one process reaches the pages on the other (its articles into #thread-live, the
parent's "N replies" line), and a page opened mid-reply on the process that does not run
the reply resumes it from its snapshot's #thread-live, gap-free. Real Daphnes, Redis,
PostgreSQL (a throwaway database), the real openai client against the simulated model."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from collab.simulator.app import SimulatorApp
from collab.simulator.testing import running_simulator_app
from tests.cluster import Browser, Cluster, Tab, postgres_cluster
from tests.servers import stored_replies
from tests.test_multiprocess import opened

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[str, SimulatorApp]]:
    # @long writes 4,000 tokens at 400 tokens/s: ten seconds in which a page opens mid-reply.
    with running_simulator_app(tps=400.0, ttft_ms=20, reply_tokens=4000, seed=35) as (url, app):
        yield url, app


@pytest.fixture
def cluster(sim: tuple[str, SimulatorApp]) -> Iterator[Cluster]:
    with postgres_cluster(sim[0], "th") as cluster:
        yield cluster


def line(tab: Tab, parent: int) -> str:
    """The last "N replies" line of `parent` the tab was sent ("" if none)."""
    found = [m.group(0) for f in tab.raw for m in re.finditer(rf'<div id="msg-{parent}-thread"[^>]*>', f)]
    return found[-1] if found else ""


async def test_a_thread_post_on_one_process_shows_on_the_other_and_resumes_there(cluster: Cluster) -> None:
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    alice, bob = await Browser.login(p1, "alice"), await Browser.login(p2, "bob")
    async with alice.open(p1) as a_ws, bob.open(p2) as b_ws:
        a, b = await opened(a_ws, b_ws)
        await a.post("the parent, on P1")
        await b.until(lambda t: any(r.role == "user" for r in t.frames.replies.values()))
        (parent,) = [i for i, r in b.frames.replies.items() if r.role == "user"]
        # On P2, in the thread: its articles reach P1's page in the thread's list.
        await b.send(text="@short in the thread, from P2", thread=parent, client_id=str(uuid.uuid4()), HEADERS={})
        for tab in (a, b):
            await tab.until(lambda t: any(r.final_attrs for r in t.assistant_replies().values()))
            assert 'data-replies="2"' in line(tab, parent)
            assert any(f.startswith('<div id="thread-live" hx-swap-oob="beforeend">') for f in tab.raw)
        # A long reply in the thread, run by P2; a page opened on P1 mid-reply resumes it.
        await b.send(text="@long at length, please", thread=parent, client_id=str(uuid.uuid4()), HEADERS={})
        await b.until(lambda t: any(r.status == "streaming" and r.pieces >= 2 for r in t.assistant_replies().values()))
        async with alice.open(p1) as late_ws:
            (late,) = await opened(late_ws)
            live = {i: len(r.text) for i, r in late.assistant_replies().items() if r.status == "streaming"}
            assert len(live) == 1 and min(live.values()) > 0, live  # in its snapshot, with the text so far
            (reply_id,) = live
            snapshot = late.raw[0]
            assert f'id="msg-{reply_id}"' not in snapshot[: snapshot.index('<ul id="members"')]  # not the room's list
            assert f'data-length="{live[reply_id]}"' in snapshot[snapshot.index('<div id="thread-live"') :]
            await late.until(lambda t: bool(t.frames.replies[reply_id].final_attrs), timeout=60)
        await b.until(lambda t: bool(t.frames.replies[reply_id].final_attrs), timeout=60)
    stored = stored_replies(cluster.env)
    for tab in (late, b):
        reply = tab.frames.replies[reply_id]
        assert (reply.lost, reply.duplicated, reply.out_of_order) == (0, 0, 0)
        assert reply.text == stored[reply_id]["text"] and reply.pieces >= 1
    assert 'data-replies="4"' in line(b, parent)
