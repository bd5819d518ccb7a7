"""Files on messages on two real server processes (docs/wire.md, "post"): a post with files
on one process reaches the members on both with its thumbnail and card, live, and a later
page's snapshot on either; two tabs on two processes posting the same upload at once:
one message gets it, the other post is refused whole. Real Daphnes, Redis, PostgreSQL (a
throwaway database: its row locks are what the race is about), the real openai client
against the simulated model. The uploads are stored as the upload view stores them
(tests/test_files_posting.py's `upload`, run in the cluster's database)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import pytest

from collab.simulator.app import SimulatorApp
from collab.simulator.testing import running_simulator_app
from tests.cluster import Browser, Cluster, Tab, postgres_cluster
from tests.test_files_posting import CARD, THUMB
from tests.test_multiprocess import opened

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[str, SimulatorApp]]:
    with running_simulator_app(tps=300.0, ttft_ms=20, reply_tokens=20, seed=29) as (url, app):
        yield url, app


@pytest.fixture
def cluster(sim: tuple[str, SimulatorApp]) -> Iterator[Cluster]:
    with postgres_cluster(sim[0], "fx") as cluster:
        yield cluster


def uploads(cluster: Cluster, owner: str, *names: str) -> list[int]:
    """Uploads of `owner` in the cluster's room, stored as the upload view stores them."""
    code = (
        "from django.contrib.auth.models import User; from collab.chat.models import Room; "
        "from tests.test_files_posting import upload; "
        f"u = User.objects.get(username={owner!r}); r = Room.objects.get(slug='lab'); "
        f"print(' '.join(str(upload(r, u, n, text='words of ' + n).pk) for n in {list(names)!r}))"
    )
    return [int(i) for i in cluster.manage("shell", "-c", code).strip().splitlines()[-1].split()]


def attached(cluster: Cluster) -> list[tuple[int, int, str]]:
    """(message id, position, name) of every posted file."""
    code = (
        "import json; from collab.chat.file_models import Attachment; "
        "print(json.dumps(list(Attachment.objects.filter(message__isnull=False)"
        ".order_by('message_id', 'position').values_list('message_id', 'position', 'name'))))"
    )
    return [tuple(row) for row in json.loads(cluster.manage("shell", "-c", code).strip().splitlines()[-1])]


def files_shown(tab: Tab) -> tuple[int, int]:
    """How many thumbnails and cards this tab was sent, in all."""
    return sum(len(THUMB.findall(f)) for f in tab.raw), sum(len(CARD.findall(f)) for f in tab.raw)


def post(tab: Tab, files: list[int], text: str = "") -> str:
    return json.dumps({"text": text, "client_id": str(uuid.uuid4()), "files": files})


async def test_files_reach_both_processes_live_and_in_the_snapshot(cluster: Cluster) -> None:
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    shot, spec = await asyncio.to_thread(uploads, cluster, "alice", "shot.png", "spec.pdf")
    alice, bob = await Browser.login(p1, "alice"), await Browser.login(p2, "bob")
    async with alice.open(p1) as a_ws, bob.open(p2) as b_ws:
        a, b = await opened(a_ws, b_ws)
        await a.ws.send(post(a, [shot, spec], "what is wrong here?"))
        for tab in (a, b):
            await tab.until(lambda t: files_shown(t) == (1, 1))
        new = next(f for f in b.raw if "file-thumb" in f)
        assert f'href="/r/lab/f/{shot}/shot.png"' in new and f'src="/r/lab/f/{shot}/thumb"' in new
        assert f'href="/r/lab/f/{spec}/spec.pdf"' in new and ">PDF<" in new
    stored = await asyncio.to_thread(attached, cluster)
    assert [(pos, name) for _, pos, name in stored] == [(0, "shot.png"), (1, "spec.pdf")]
    for process in (p1, p2):  # a later page, on either process: in its snapshot
        async with bob.open(process) as again_ws:
            (again,) = await opened(again_ws)
            assert files_shown(again) == (1, 1)


async def test_two_posts_on_two_processes_racing_for_one_upload(cluster: Cluster) -> None:
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    (shot,) = await asyncio.to_thread(uploads, cluster, "alice", "shot.png")
    alice = await Browser.login(p1, "alice")
    async with alice.open(p1) as one_ws, alice.open(p2) as two_ws:
        one, two = await opened(one_ws, two_ws)
        await asyncio.gather(one.ws.send(post(one, [shot], "mine on P1")), two.ws.send(post(two, [shot], "mine on P2")))
        # Each socket runs its actions in order: the answer to a probe that changes nothing
        # (not JSON: frame.malformed) comes after its post's own answer, if it had one.
        for tab in (one, two):
            await tab.ws.send("probe")
        for tab in (one, two):
            await tab.until(lambda t: files_shown(t)[0] == 1 and any("frame.malformed" in f for f in t.raw))
    refusals = [f for f in one.raw + two.raw if "file.not_found" in f]
    assert len(refusals) == 1
    stored = await asyncio.to_thread(attached, cluster)
    assert len(stored) == 1 and stored[0][2] == "shot.png"
    assert await asyncio.to_thread(cluster.count_messages) == 1  # the refused post stored nothing
