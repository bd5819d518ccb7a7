"""Personal replies (`/each`) on two real server processes: a reply run on one process
streams to its recipient's sockets on the other, and to nobody else's there, until it is
shared (docs/architecture.md#a-personal-replies). Real Daphnes, Redis, PostgreSQL, the
real openai client against the simulated model."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from collab.simulator.app import SimulatorApp
from collab.simulator.testing import running_simulator_app
from tests.cluster import PASSWORD, Browser, Cluster, Tab, metric, postgres_cluster
from tests.test_multiprocess import opened

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(180)]

DAVE = f"""
from django.contrib.auth.models import User
from collab.chat.models import Membership, Room
Membership.objects.create(room=Room.objects.get(slug="lab"), user=User.objects.create_user("dave", password="{PASSWORD}"))
"""


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[str, SimulatorApp]]:
    with running_simulator_app(tps=300.0, ttft_ms=20, reply_tokens=200, seed=11) as (url, app):
        yield url, app


@pytest.fixture
def cluster(sim: tuple[str, SimulatorApp]) -> Iterator[Cluster]:
    with postgres_cluster(sim[0], "pr", DAVE) as cluster:
        yield cluster


def holds(tab: Tab, reply_id: int) -> bool:
    return any(f'id="msg-{reply_id}"' in raw or f'id="msg-{reply_id}-' in raw for raw in tab.raw)


async def test_a_personal_reply_reaches_its_recipient_on_the_other_process_and_nobody_else(
    cluster: Cluster, sim: tuple[str, SimulatorApp]
) -> None:
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    alice, bob, dave = [await Browser.login(p1, name) for name in ("alice", "bob", "dave")]
    tag = uuid.uuid4().hex[:8]
    lenses = {"alice": f"answer me in Spanish {tag}", "bob": f"I am the designer {tag}"}
    async with (
        alice.open(p1) as a1_ws,
        alice.open(p2) as a2_ws,
        bob.open(p2) as b_ws,
        dave.open(p2) as d_ws,
    ):
        a1, a2, b, d = await opened(a1_ws, a2_ws, b_ws, d_ws)
        await a1.send(action="lens", text=lenses["alice"])  # set on P1: her tab on P2 shows it too
        await a2.until(lambda t: any(f'data-lens="{lenses["alice"]}"' in r for r in t.raw))
        await b.send(action="lens", text=lenses["bob"])
        await b.until(lambda t: any(f'data-lens="{lenses["bob"]}"' in r for r in t.raw))
        await a1.post("/each @short what should we build?")  # the replies run on P1
        for tab in (a1, a2, b):
            await tab.until(lambda t: any(r.final_attrs for r in t.assistant_replies().values()))
        stored = cluster.replies()
        (bobs,) = b.assistant_replies().values()
        (alices,) = a2.assistant_replies().values()
        assert bobs.id != alices.id and [*a1.assistant_replies()] == [alices.id]
        assert bobs.final_attrs["data-recipient"] == "bob" and alices.final_attrs["data-recipient"] == "alice"
        assert bobs.pieces >= 1 and (bobs.lost, bobs.duplicated, bobs.out_of_order) == (0, 0, 0)  # live, whole
        assert bobs.text == stored[bobs.id]["text"] != stored[alices.id]["text"]
        for lens in lenses.values():  # each request held its own lens
            assert sum(lens in str(r["messages"]) for r in list(sim[1].recorded)) == 1
        # the question reached dave; neither reply did (the replies are stored: all sent)
        await d.until(lambda t: any(r.role == "user" for r in t.frames.replies.values()))
        assert not holds(b, alices.id) and not holds(a2, bobs.id)

        await b.send(action="share", message_id=bobs.id)  # shared on P2
        for tab in (d, a1, a2):
            await tab.until(lambda t: holds(t, bobs.id))
        assert not holds(d, alices.id)
        assert [r.id for r in d.assistant_replies().values()] == [bobs.id]
        assert 'data-recipient="bob"' not in next(r for r in d.raw if holds_frame(r, bobs.id))


def holds_frame(raw: str, reply_id: int) -> bool:
    return f'id="msg-{reply_id}"' in raw


async def test_a_shared_snapshot_shows_each_member_their_own_personal_replies_only(cluster: Cluster) -> None:
    """Sockets that connect to a room while nothing changed share one read of its shared
    part (services/snapshot_cache.py); each still gets its own personal replies, and
    nobody else's. Real processes: the replies run on P1, the snapshots are P2's."""
    token = uuid.uuid4().hex
    p1, p2 = cluster.start("P1"), cluster.start("P2", COLLAB_METRICS_TOKEN=token)
    alice, bob, dave = [await Browser.login(p1, name) for name in ("alice", "bob", "dave")]
    tag = uuid.uuid4().hex[:8]
    async with alice.open(p1) as a_ws, bob.open(p1) as b_ws, dave.open(p2) as watch_ws:
        a, b, watch = await opened(a_ws, b_ws, watch_ws)  # `watch` keeps the room's hub on P2
        for tab, who in ((a, "alice"), (b, "bob")):
            await tab.send(action="lens", text=f"for {who} {tag}")
            await tab.until(lambda t, who=who: any(f'data-lens="for {who} {tag}"' in r for r in t.raw))
        await a.post("/each @short what should we build?")
        for tab in (a, b):
            await tab.until(lambda t: any(r.final_attrs for r in t.assistant_replies().values()))
        (alices,) = a.assistant_replies().values()
        (bobs,) = b.assistant_replies().values()
        await watch.until(lambda t: any(r.role == "user" for r in t.frames.replies.values()))
        read = "collab_snapshot_reads_total"
        before = (
            metric(p2.url, token, f'{read}{{source="shared"}}'),
            metric(p2.url, token, f'{read}{{source="read"}}'),
        )
        # Each in turn, while nothing else happens in the room: one read of the shared part.
        shown: dict[str, list[str]] = {}
        for who, browser in (("alice", alice), ("dave", dave), ("bob", bob), ("dave2", dave)):
            async with browser.open(p2) as ws:
                (tab,) = await opened(ws)
                shown[who] = tab.raw
        after = metric(p2.url, token, f'{read}{{source="shared"}}'), metric(p2.url, token, f'{read}{{source="read"}}')
        assert after[0] - before[0] >= 2 and after[1] - before[1] <= 2  # shared, not read each time

        def holds_reply(raw: list[str], reply_id: int) -> bool:
            return any(f'id="msg-{reply_id}"' in r for r in raw)

        assert holds_reply(shown["alice"], alices.id) and not holds_reply(shown["alice"], bobs.id)
        assert holds_reply(shown["bob"], bobs.id) and not holds_reply(shown["bob"], alices.id)
        for who in ("dave", "dave2"):
            assert not holds_reply(shown[who], alices.id) and not holds_reply(shown[who], bobs.id)
            assert any("what should we build?" in r for r in shown[who])  # the question is everyone's
