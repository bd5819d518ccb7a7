"""Votes on two real server processes: a vote taken on one process updates the reply's
counts on every member's page on the other (docs/wire.md, "vote"). Real Daphnes, Redis,
PostgreSQL (a throwaway database), the real openai client against the simulated model."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from collab.simulator.app import SimulatorApp
from collab.simulator.testing import running_simulator_app
from tests.cluster import Browser, Cluster, Tab, postgres_cluster
from tests.test_multiprocess import opened

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[str, SimulatorApp]]:
    with running_simulator_app(tps=300.0, ttft_ms=20, reply_tokens=40, seed=14) as (url, app):
        yield url, app


@pytest.fixture
def cluster(sim: tuple[str, SimulatorApp]) -> Iterator[Cluster]:
    with postgres_cluster(sim[0], "vt") as cluster:
        yield cluster


def shows(tab: Tab, reply_id: int, up: int, down: int) -> bool:
    """The tab's last vote bar for this reply has these counts."""
    bars = [r for r in tab.raw if f'id="msg-{reply_id}-votes"' in r and "<article" not in r]
    return bool(bars) and f'data-votes-up="{up}" data-votes-down="{down}"' in bars[-1]


def stored_votes(cluster: Cluster, reply_id: int) -> dict[str, object]:
    code = (
        "import json; from collab.chat.models import Message, Vote; "
        f"m = Message.objects.get(pk={reply_id}); "
        "print(json.dumps({'up': m.votes_up, 'down': m.votes_down, 'verdict': m.verdict, "
        "'rows': sorted([v.voter_name, v.value] for v in Vote.objects.filter(message=m))}))"
    )
    return json.loads(cluster.manage("shell", "-c", code).strip().splitlines()[-1])


async def test_a_vote_on_one_process_updates_the_counts_on_the_other(cluster: Cluster) -> None:
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    alice, bob = await Browser.login(p1, "alice"), await Browser.login(p2, "bob")
    async with alice.open(p1) as a_ws, bob.open(p2) as b_ws, bob.open(p1) as b1_ws:
        a, b, b1 = await opened(a_ws, b_ws, b1_ws)
        await a.post("@short which way?")
        for tab in (a, b):
            await tab.until(lambda t: any(r.final_attrs for r in t.assistant_replies().values()))
        (reply_id,) = a.assistant_replies()
        await b.send(action="vote", message_id=reply_id, value="up")  # on P2
        for tab in (a, b, b1):  # alice on P1, and bob's own tabs on both
            await tab.until(lambda t: shows(t, reply_id, 1, 0))
        await a.send(action="vote", message_id=reply_id, value="down")  # on P1
        for tab in (a, b, b1):
            await tab.until(lambda t: shows(t, reply_id, 1, 1))
        await b.send(action="vote", message_id=reply_id, value="down")  # bob changes his: replaced
        for tab in (a, b, b1):
            await tab.until(lambda t: shows(t, reply_id, 0, 2))
    assert stored_votes(cluster, reply_id) == {
        "up": 0,
        "down": 2,
        "verdict": "rejected",
        "rows": [["alice", "down"], ["bob", "down"]],
    }
