"""Two real Daphnes on three Redis servers (REDIS_URL a comma-separated list: the channel
layer and the shared state sharded over them, docs/architecture.md#a-sharding): the
scale-out tests of tests/test_multiprocess.py that touch every sharded part (a live reply
seen on the other process, stop across processes, a dead owner's lease swept, presence),
run again here, and one of the servers restarted mid-reply.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from collab.chat.shared.sharded import shard_index
from collab.simulator.app import SimulatorApp
from tests import test_multiprocess as mp
from tests.cluster import Browser, Cluster, Tab, postgres_cluster
from tests.test_outage import RESYNCED_WITHIN_S
from tests.test_sharded import RedisServer, three_servers

shards_fixture = pytest.fixture(scope="module", name="shards")(three_servers)

# test_multiprocess's fixtures and the tests that touch every sharded part, run here on
# sharded Redis (this module's `cluster` fixture replaces that module's).
sim, two = mp.sim, mp.two
test_members_on_both_processes_see_the_pieces_live = mp.test_members_on_both_processes_see_the_pieces_live
test_stop_from_the_other_process_closes_the_upstream = mp.test_stop_from_the_other_process_closes_the_upstream
test_kill_9_of_the_generating_process_interrupts_its_replies = (
    mp.test_kill_9_of_the_generating_process_interrupts_its_replies
)
test_presence_across_processes = mp.test_presence_across_processes
opened, streaming_with_text, the_reply = mp.opened, mp.streaming_with_text, mp.the_reply

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(180)]


@pytest.fixture
def cluster(sim: tuple[str, SimulatorApp], shards: list[RedisServer]) -> Iterator[Cluster]:
    """test_multiprocess's cluster, its Redis three servers."""
    urls = ",".join(s.url for s in shards)
    with postgres_cluster(sim[0], "shard", COLLAB_POST_REFILL_S="600", REDIS_URL=urls) as cluster:
        yield cluster


def where(shards: list[RedisServer], pattern: str) -> dict[str, int]:
    """Every key matching `pattern`, and the index of the server that holds it."""
    found: dict[str, int] = {}
    for n, server in enumerate(shards):
        for key in server.client().scan_iter(match=pattern):
            assert key.decode() not in found, f"{key!r} on two servers"
            found[key.decode()] = n
    return found


async def test_a_server_restarted_mid_reply_loses_nothing_and_every_member_converges(
    two: tuple[Cluster, Browser, Browser], shards: list[RedisServer]
) -> None:
    cluster, alice, bob = two
    p1, p2 = cluster.processes
    prefix = cluster.env["COLLAB_REDIS_PREFIX"]
    async with alice.open(p1) as a_ws, bob.open(p2) as b_ws:
        a, b = await opened(a_ws, b_ws)
        await a.post("@long a long one, across the shards")
        await b.until(lambda t: streaming_with_text(t, 100))
        reply_id = the_reply(b).id
        # Each key on the server its room or reply hashes to.
        (presence,) = where(shards, f"{prefix}pr:[0-9]*").items()
        assert presence[1] == shard_index(int(presence[0].rsplit(":", 1)[1]), 3)
        home = shard_index(reply_id, 3)
        assert where(shards, f"{prefix}r:{reply_id}*") == {
            f"{prefix}r:{reply_id}{suffix}": home for suffix in ("", ":t", ":k")
        }
        snapshots = [tab.frames.snapshots for tab in (a, b)]

        shards[home].stop()  # the reply's server: its text, its lease, maybe some of the layer's channels
        shards[home].start()  # empty
        back_at = time.monotonic()
        for tab, before in zip((a, b), snapshots, strict=True):  # each socket gets the room's snapshot again

            def resynced_tab(t: Tab, before: int = before) -> bool:
                return t.frames.snapshots > before

            await tab.until(resynced_tab, timeout=15)
        resynced = time.monotonic() - back_at
        assert resynced <= RESYNCED_WITHIN_S, f"resynced {resynced:.1f} s after the server came back"
        async with asyncio.timeout(5):  # the owner put the reply's record back on its server
            while not where(shards, f"{prefix}r:{reply_id}:t"):  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        for tab in (a, b):
            await tab.until(lambda t: bool(the_reply(t).final_attrs), timeout=60)
    print(f"one of three Redis servers restarted: both sockets resynced {resynced:.1f} s after it came back")
    stored = cluster.replies()[reply_id]
    assert stored["status"] == "done"  # nothing interrupted: the owner kept running it
    for tab in (a, b):
        reply = the_reply(tab)
        assert reply.final_attrs["data-status"] == "done"
        assert stored["text"].startswith(reply.text)
        assert reply.lost == 0 and reply.duplicated == 0
