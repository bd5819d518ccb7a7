"""Pins on two real server processes (docs/wire.md, "pin a message"): a pin taken on one
process reaches the pages on the other, and a later page's snapshot. Real Daphnes, Redis,
PostgreSQL (a throwaway database), the real openai client against the simulated model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from collab.simulator.app import SimulatorApp
from collab.simulator.testing import running_simulator_app
from tests.cluster import Browser, Cluster, postgres_cluster
from tests.test_multiprocess import opened
from tests.test_pins import pinned_ids

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[str, SimulatorApp]]:
    with running_simulator_app(tps=300.0, ttft_ms=20, reply_tokens=20, seed=21) as (url, app):
        yield url, app


@pytest.fixture
def cluster(sim: tuple[str, SimulatorApp]) -> Iterator[Cluster]:
    with postgres_cluster(sim[0], "pn") as cluster:
        yield cluster


async def test_a_pin_on_one_process_shows_on_the_other(cluster: Cluster) -> None:
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    alice, bob = await Browser.login(p1, "alice"), await Browser.login(p2, "bob")
    async with alice.open(p1) as a_ws, bob.open(p2) as b_ws:
        a, b = await opened(a_ws, b_ws)
        await a.post("pin me, please")
        await b.until(lambda t: any(r.role == "user" for r in t.frames.replies.values()))
        (question,) = [i for i, r in b.frames.replies.items() if r.role == "user"]
        await b.send(action="pin", message_id=question)  # on P2
        for tab in (a, b):
            await tab.until(lambda t: pinned_ids(t.raw) == [question])
        await b.send(action="unpin", message_id=question)
        for tab in (a, b):
            await tab.until(lambda t: pinned_ids(t.raw) == [])
        await a.send(action="pin", message_id=question)  # on P1
        await b.until(lambda t: pinned_ids(t.raw) == [question])
    async with bob.open(p1) as again_ws:  # a later page on the other process: in its snapshot
        (again,) = await opened(again_ws)
        assert pinned_ids(again.raw) == [question]
