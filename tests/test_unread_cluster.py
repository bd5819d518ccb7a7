"""Unread on two real server processes (docs/wire.md, "mark read", "My rooms"): a post on
one process reaches the sidebar of a member whose socket, on the other, shows another
room; their read on one process clears it on the other; a reconnect counts as the
database does. Real Daphnes, Redis, PostgreSQL, the real openai client against the
simulated model."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.asyncio.client import connect

from collab.simulator.app import SimulatorApp
from collab.simulator.testing import running_simulator_app
from tests.cluster import Browser, Cluster, Process, Tab, postgres_cluster
from tests.test_multiprocess import opened

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(180)]

OTHER = """
other = rooms.create_room(alice, "Other", topic="elsewhere")
Membership.objects.create(room=other, user=bob)
print("ROOMS", room.pk, other.pk)
"""
ENTRY = re.compile(r'<li id="nav-room-(\d+)"[^>]*data-unread="(\d+)" data-mention="(1?)"')


def entry(tab: Tab, room_id: int) -> tuple[int, bool] | None:
    found = [(int(n), f == "1") for frame in tab.raw for r, n, f in ENTRY.findall(frame) if int(r) == room_id]
    return found[-1] if found else None


def room_ids(cluster: Cluster) -> tuple[int, int]:
    code = "from collab.chat.models import Room; print(*[Room.objects.get(slug=s).pk for s in ('lab', 'other')])"
    lab, other = cluster.manage("shell", "-c", code).strip().splitlines()[-1].split()
    return int(lab), int(other)


def open_room(browser: Browser, process: Process, slug: str) -> Any:
    url = process.url.replace("http", "ws") + f"/ws/rooms/{slug}/"
    return connect(url, origin=process.url, additional_headers={"Cookie": f"sessionid={browser.cookie}"})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[str, SimulatorApp]]:
    with running_simulator_app(tps=300.0, ttft_ms=20, reply_tokens=20, seed=35) as (url, app):
        yield url, app


@pytest.fixture
def cluster(sim: tuple[str, SimulatorApp]) -> Iterator[Cluster]:
    with postgres_cluster(sim[0], "ur", OTHER) as cluster:
        yield cluster


async def test_unread_and_mentions_cross_processes_and_a_read_clears_them(cluster: Cluster) -> None:
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    lab, other = room_ids(cluster)
    alice, bob = await Browser.login(p1, "alice"), await Browser.login(p2, "bob")
    async with alice.open(p1) as a_ws, open_room(bob, p2, "other") as b_ws:
        a, b_elsewhere = await opened(a_ws, b_ws)
        assert entry(b_elsewhere, lab) == (0, False)
        await a.post("@short what changed?")  # on P1: the question and the reply's placeholder
        await b_elsewhere.until(lambda t: entry(t, lab) == (2, False))
        await a.post("@bob over to you")
        await b_elsewhere.until(lambda t: entry(t, lab) == (3, True))
        await a.until(lambda t: sum(1 for r in t.assistant_replies().values() if r.final_attrs) == 1)
        async with bob.open(p1) as b2_ws:  # bob opens the room on the other process
            (b_here,) = await opened(b2_ws)
            assert entry(b_here, lab) == (3, True)  # the snapshot: the database's count
            assert entry(b_here, other) == (0, False)
            await b_here.send(action="read")  # on P1: up to the room's last seq
            await b_elsewhere.until(lambda t: entry(t, lab) == (0, False))  # on P2
            await b_here.until(lambda t: entry(t, lab) == (0, False))
            await b_here.send(action="read", seq=10_000)
            await b_here.until(lambda t: any(code == "read.beyond_last" for code, _ in t.frames.errors))
        await a.post("one more")  # after the read: counted again, live
        await b_elsewhere.until(lambda t: entry(t, lab) == (1, False))
        assert entry(a, lab) == (0, False)  # her open room: its entry moves by reads only (the page counts)
    async with open_room(bob, p1, "other") as again_ws:  # a reconnect on the other process
        (again,) = await opened(again_ws)
        assert entry(again, lab) == (1, False)
