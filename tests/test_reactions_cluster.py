"""Reactions on two real server processes (docs/wire.md, "react"): a reaction given on one
process reaches the pages on the other, live, and a later page's snapshot on either. Real
Daphnes, Redis, PostgreSQL (a throwaway database), the real openai client against the
simulated model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from collab.simulator.app import SimulatorApp
from collab.simulator.testing import running_simulator_app
from tests.cluster import Browser, Cluster, postgres_cluster
from tests.test_multiprocess import opened
from tests.test_reactions import counts

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[str, SimulatorApp]]:
    with running_simulator_app(tps=300.0, ttft_ms=20, reply_tokens=20, seed=23) as (url, app):
        yield url, app


@pytest.fixture
def cluster(sim: tuple[str, SimulatorApp]) -> Iterator[Cluster]:
    with postgres_cluster(sim[0], "rx") as cluster:
        yield cluster


async def test_a_reaction_on_one_process_shows_on_the_other(cluster: Cluster) -> None:
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    alice, bob = await Browser.login(p1, "alice"), await Browser.login(p2, "bob")
    async with alice.open(p1) as a_ws, bob.open(p2) as b_ws:
        a, b = await opened(a_ws, b_ws)
        await a.post("@short react to this, please")
        await b.until(lambda t: any(r.role == "assistant" and r.status == "done" for r in t.frames.replies.values()))
        (question,) = [i for i, r in b.frames.replies.items() if r.role == "user"]
        (reply,) = [i for i, r in b.frames.replies.items() if r.role == "assistant"]
        await b.send(action="react", message_id=question, emoji="🎉")  # on P2
        await a.send(action="react", message_id=reply, emoji="👀")  # on P1
        for tab in (a, b):
            await tab.until(lambda t: counts(t.raw, question) == {"🎉": (1, "bob")})
            await tab.until(lambda t: counts(t.raw, reply) == {"👀": (1, "alice")})
        await a.send(action="react", message_id=question, emoji="🎉")  # alice too, on P1
        await b.until(lambda t: counts(t.raw, question) == {"🎉": (2, "bob alice")})
        await b.send(action="react", message_id=question, emoji="🎉")  # bob takes his back, on P2
        await a.until(lambda t: counts(t.raw, question) == {"🎉": (1, "alice")})
    for process in (p1, p2):  # a later page, on either process: in its snapshot
        async with bob.open(process) as again_ws:
            (again,) = await opened(again_ws)
            assert counts(again.raw, question) == {"🎉": (1, "alice")}
            assert counts(again.raw, reply) == {"👀": (1, "alice")}
