"""Versions of a reply on two real server processes (docs/wire.md, "regenerate a reply"
and "show a version"): regenerations from either process make one slot of versions, a
version chosen on one process takes the slot's place on the other's pages, a socket that
joins late or comes back after a drop is shown the chosen version, and the next turn's
history (what the simulated model, a real server, is sent) holds it and no other. Real
Daphnes, Redis, PostgreSQL (a throwaway database), the real openai client."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from collab.loadtest import wire
from collab.simulator.app import SimulatorApp
from collab.simulator.testing import running_simulator_app
from tests.cluster import Browser, Cluster, Tab, postgres_cluster
from tests.test_multiprocess import opened

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[str, SimulatorApp]]:
    with running_simulator_app(tps=300.0, ttft_ms=20, reply_tokens=20, seed=34) as (url, app):
        yield url, app


@pytest.fixture
def cluster(sim: tuple[str, SimulatorApp]) -> Iterator[Cluster]:
    with postgres_cluster(sim[0], "vr") as cluster:
        yield cluster


def ended(tab: Tab, reply_id: int) -> bool:
    r = tab.frames.replies.get(reply_id)
    return r is not None and r.final_attrs.get("data-status") == "done"


def articles_of(html: str, msg_id: int) -> list[wire.ArticleInfo]:
    return [a for a in wire.articles(html) if a.msg == msg_id]


def swapped_in(tab: Tab, msg_id: int, versions: int) -> bool:
    """The tab was sent message `msg_id`'s article for its slot's place, out of `versions`."""
    return any(
        a.attrs.get("hx-swap-oob", "").startswith("outerHTML:") and a.attrs.get("data-versions") == str(versions)
        for frame in tab.raw
        for a in articles_of(frame, msg_id)
    )


def set_prompt(cluster: Cluster, text: str) -> None:
    """Another room prompt: the simulated model writes another text for the same question."""
    cluster.manage("shell", "-c", f"from collab.chat.models import Room; Room.objects.update(system_prompt={text!r})")


def stored_versions(cluster: Cluster) -> list[list[object]]:
    code = (
        "import json; from collab.chat.models import Message; print(json.dumps([list(r) for r in "
        "Message.objects.filter(role='assistant', recipient=None).order_by('seq')"
        ".values_list('id', 'version_of_id', 'version', 'versions', 'version_hidden')]))"
    )
    return json.loads(cluster.manage("shell", "-c", code).strip().splitlines()[-1])


async def refused(tab: Tab, **frame: object) -> str:
    n = len(tab.frames.errors)
    await tab.send(**frame)
    await tab.until(lambda t: len(t.frames.errors) > n)
    return tab.frames.errors[n][0]


async def test_versions_made_and_chosen_on_either_process_show_everywhere(
    cluster: Cluster, sim: tuple[str, SimulatorApp]
) -> None:
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    alice, bob = await Browser.login(p1, "alice"), await Browser.login(p2, "bob")
    async with alice.open(p1) as a_ws:
        async with bob.open(p2) as b_ws:
            a, b = await opened(a_ws, b_ws)
            await a.post("@short which fruit for the party?")
            await a.until(lambda t: any(ended(t, i) for i in t.assistant_replies()))
            (first,) = a.assistant_replies()
            set_prompt(cluster, "round two")
            await a.send(action="regenerate", message_id=first)  # on P1
            await b.until(lambda t: any(ended(t, i) for i in t.assistant_replies() if i != first))
            (second,) = set(b.assistant_replies()) - {first}
            set_prompt(cluster, "round three")
            await b.send(action="regenerate", message_id=second)  # on P2
            await a.until(lambda t: any(ended(t, i) for i in t.assistant_replies() if i not in (first, second)))
            (third,) = set(a.assistant_replies()) - {first, second}
            assert stored_versions(cluster) == [
                [first, None, 1, 3, True],
                [second, first, 2, 3, True],
                [third, first, 3, 3, False],
            ]
            for tab in (a, b):  # each new version took the slot's place, on both processes
                await tab.until(lambda t: swapped_in(t, second, 2) and swapped_in(t, third, 3))
            await b.send(action="show_version", message_id=third, version=2)  # on P2 ...
            await a.until(lambda t: swapped_in(t, second, 3))  # ... seen on P1
        # bob's page drops; meanwhile alice shows version 1 (on P1); bob comes back on P2.
        await a.send(action="show_version", message_id=second, version=1)
        await a.until(lambda t: swapped_in(t, first, 3))
        async with bob.open(p2) as b_ws, alice.open(p2) as late_ws:
            b, late = await opened(b_ws, late_ws)
            for tab in (b, late):  # the resumed page and a late one: version 1 of 3, nothing else of the slot
                snapshot = tab.raw[0]
                (shown,) = [x for x in wire.articles(snapshot) if x.attrs.get("data-slot") == str(first)]
                assert shown.msg == first and (shown.attrs["data-version"], shown.attrs["data-versions"]) == ("1", "3")
                assert 'aria-live="polite">1 / 3<' in shown.inner
            # The next turn, asked on P2: the model is sent version 1 and no other.
            before = len(sim[1].recorded)
            await b.post("@long and which drink goes with it?")
            await b.until(lambda t: any(ended(t, i) for i in t.assistant_replies() if i not in (first, second, third)))
            texts = cluster.replies()
            requests = [r for r in sim[1].recorded[before:] if "which drink" in str(r["messages"])]
            assert requests
            for request in requests:
                sent = "\n".join(str(turn["content"]) for turn in request["messages"])
                assert texts[first]["text"] in sent
                assert texts[second]["text"] not in sent and texts[third]["text"] not in sent
            # Refused, over the wire: no such reply, another member's personal reply, a locked room.
            await b.send(action="lens", text="answer in Spanish")
            await b.until(lambda t: any('id="lens"' in f and "Spanish" in f for f in t.raw))
            await a.post("/each @short what about dessert?")
            await b.until(
                lambda t: any(r.final_attrs.get("data-recipient") == "bob" for r in t.frames.replies.values())
            )
            (personal,) = [i for i, r in b.frames.replies.items() if r.final_attrs.get("data-recipient") == "bob"]
            assert await refused(a, action="show_version", message_id=10**9) == "message.not_found"
            assert await refused(a, action="show_version", message_id=personal) == "message.not_found"
            await a.send(action="lock")
            await late.until(lambda t: any('id="room-status"' in f and 'data-status="locked"' in f for f in t.raw))
            assert await refused(b, action="show_version", message_id=second) == "room.locked"
    assert [row[-1] for row in stored_versions(cluster)[:3]] == [False, True, True]
