"""Steering across two real server processes (docs/wire.md, "steer a reply"): the note is
sent on one process's socket, the reply runs on the other; and the process running a
steered reply is killed mid-continuation. Real Daphnes, Redis, PostgreSQL (a throwaway
database), the real openai client against the simulated model (whose `{{hold}}` keeps a
request streaming until it is steered: collab/simulator/directives.py)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from collab.chat.replies.steering import PROMPT
from collab.chat.steer import MARK
from collab.simulator.app import SimulatorApp
from collab.simulator.testing import running_simulator_app
from collab.simulator.text import simulated_tokens
from tests.cluster import Browser, Cluster, Tab, postgres_cluster
from tests.test_multiprocess import opened, the_reply

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(180)]

NOTE = "shorter, and in French"
TOKENS = 20


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[str, SimulatorApp]]:
    with running_simulator_app(tps=300.0, ttft_ms=20, reply_tokens=TOKENS, seed=21) as (url, app):
        yield url, app


@pytest.fixture
def cluster(sim: tuple[str, SimulatorApp]) -> Iterator[Cluster]:
    with postgres_cluster(sim[0], "st") as cluster:
        yield cluster


def status(tab: Tab) -> str:
    return the_reply(tab).final_attrs.get("data-status", "") if tab.assistant_replies() else ""


def started(tab: Tab) -> bool:
    return bool(tab.assistant_replies()) and the_reply(tab).pieces >= 1


async def test_a_steer_sent_on_one_process_steers_the_reply_running_on_the_other(
    cluster: Cluster, sim: tuple[str, SimulatorApp]
) -> None:
    app = sim[1]
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    alice, bob = await Browser.login(p1, "alice"), await Browser.login(p2, "bob")
    async with alice.open(p1) as a_ws, bob.open(p2) as b_ws:
        a, b = await opened(a_ws, b_ws)
        await a.post("@long {{hold}} tell me about boats")  # stored on P1: its reply runs there
        await b.until(started)
        reply_id = the_reply(b).id
        await b.send(action="steer", message_id=reply_id, text=NOTE)  # on P2
        for tab in (a, b):
            await tab.until(lambda t: status(t) == "done")
        assert not a.frames.errors and not b.frames.errors
    stored = cluster.replies()[reply_id]
    mark = "\n\n" + f"{MARK}bob: {NOTE}" + "\n\n"
    assert stored["status"] == "done" and stored["text"].count(mark) == 1
    before, after = stored["text"].split(mark)
    (second,) = [r for r in app.recorded if r["messages"][-1]["content"] == PROMPT.format(by="bob", note=NOTE)]
    assert second["messages"][-2] == {"role": "assistant", "content": before}
    assert after == "".join(simulated_tokens(second["messages"], 21, "sim", TOKENS))
    for tab in (a, b):  # both saw it live: every piece once, the marker among them
        reply = the_reply(tab)
        assert reply.text == stored["text"] and reply.lost == 0 and reply.duplicated == 0
        assert f'<span class="steer-mark">{MARK}bob: {NOTE}</span>' in reply.final_html
    async with bob.open(p1) as late_ws:  # after it, on the other process: its snapshot
        (late,) = await opened(late_ws)
        assert f'<span class="steer-mark">{MARK}bob: {NOTE}</span>' in late.raw[0]


async def test_a_steered_reply_whose_process_dies_ends_interrupted_with_its_text(cluster: Cluster) -> None:
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    alice, bob = await Browser.login(p1, "alice"), await Browser.login(p2, "bob")
    async with alice.open(p1) as a_ws, bob.open(p2) as b_ws:
        a, b = await opened(a_ws, b_ws)
        await a.post("@long {{hold}} tell me about boats")
        await b.until(started)
        await b.send(action="steer", message_id=the_reply(b).id, text="{{hold}} slower")  # its next request holds too
        mark = f"{MARK}bob: {{{{hold}}}} slower\n\n"
        await b.until(lambda t: mark in the_reply(t).text and not the_reply(t).text.endswith(mark))
        seen = the_reply(b).text
        p1.proc.send_signal(signal.SIGKILL)  # the process running it, mid-continuation
        await b.until(lambda t: status(t) == "interrupted", timeout=30)
    stored = cluster.replies()[the_reply(b).id]
    assert stored["status"] == "interrupted" and stored["text"].startswith(seen)
    assert the_reply(b).final_html.count('class="steer-mark"') == 1
