"""Presence (docs/wire.md, the member list): every member is listed with `data-user` and
`data-online`, right after a connect and a disconnect, for everyone, whatever the shared
state (memory, a real Redis); across two real Daphne processes on one Redis, a member
whose process is killed (no goodbye) drops out within 10 s. The cluster here runs on one
SQLite file (presence writes nothing to the database): tests/test_multiprocess.py has the
PostgreSQL one."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from collab.loadtest.wire import member_list
from collab.simulator.testing import running_simulator_app
from tests.cluster import SETUP, Browser, Cluster, Tab
from tests.conftest import Member, World, member, require_redis
from tests.servers import migrate


def listed(m: Member) -> dict[str, bool]:
    """The member list as this socket's page shows it: its snapshot's, then the changes."""
    shown: dict[str, bool] = {}
    for frame in m.raw:
        shown = member_list(shown, frame) or shown
    return shown


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("layer", "replies_idle")
async def test_online_right_after_connect_and_offline_right_after_disconnect(world: World) -> None:
    async with member(world.alice) as alice:
        assert listed(alice) == {"alice": True, "bob": False}  # her own snapshot shows her
        async with member(world.bob) as bob:
            assert listed(bob) == {"alice": True, "bob": True}
            await alice.until(lambda f: listed(alice).get("bob") is True)
            async with member(world.bob) as tab2:  # a second tab opens, and closes
                assert listed(tab2) == {"alice": True, "bob": True}
            # bob is still online (his first tab is open): a new socket's list says so.
            async with member(world.alice) as alice_tab2:
                assert listed(alice_tab2) == {"alice": True, "bob": True}
        await alice.until(lambda f: listed(alice).get("bob") is False)
        assert listed(alice) == {"alice": True, "bob": False}


# --- two real processes on one Redis --------------------------------------------------------------

SIM_TPS, SIM_TOKENS = 150.0, 200


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with running_simulator_app(tps=SIM_TPS, ttft_ms=20, reply_tokens=SIM_TOKENS, seed=5) as (url, _app):
        yield url


@pytest.fixture
def cluster(sim_url: str, tmp_path: os.PathLike[str]) -> Iterator[Cluster]:
    redis_url = require_redis()
    env = {
        **os.environ,
        "COLLAB_SQLITE_PATH": os.path.join(tmp_path, "cluster.sqlite3"),
        "REDIS_URL": redis_url,
        "COLLAB_REDIS_PREFIX": f"pr{os.urandom(4).hex()}:",
        "DJANGO_SECRET_KEY": os.urandom(32).hex(),  # one key: a session is valid on every process
        "COLLAB_LLM_BASE_URL": sim_url,
        "COLLAB_LLM_MODEL": "sim",
        "DJANGO_SETTINGS_MODULE": "collab.settings",
    }
    env.pop("DATABASE_URL", None)
    env.pop("COLLAB_SHARED_REDIS_URL", None)
    cluster = Cluster(env)
    migrate(cluster.env)
    cluster.manage("shell", "-c", SETUP)
    try:
        yield cluster
    finally:
        cluster.stop_all()


async def opened(tab: Tab) -> Tab:
    await tab.until(lambda t: t.frames.snapshots == 1)
    return tab


@pytest.mark.e2e
@pytest.mark.redis
@pytest.mark.timeout(120)
async def test_a_killed_process_members_drop_out_within_10_s(cluster: Cluster) -> None:
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    alice, bob = await Browser.login(p1, "alice"), await Browser.login(p1, "bob")
    async with alice.open(p1) as a_ws:
        a = await opened(Tab(a_ws))
        assert a.members == {"alice": True, "bob": False}
        async with bob.open(p2) as b_ws:
            b = await opened(Tab(b_ws))
            assert b.members == {"alice": True, "bob": True}  # alice is on the other process
            await a.until(lambda t: t.members.get("bob") is True)
            p2.proc.send_signal(signal.SIGKILL)  # bob's process dies: nobody says goodbye
            killed = time.monotonic()
            await a.until(lambda t: t.members.get("bob") is False, timeout=30)
            gone_after = time.monotonic() - killed
            print(f"presence: a killed process's member shown offline {gone_after:.1f} s later")
            assert gone_after < 10.0  # docs/wire.md: within 10 s


@pytest.mark.e2e
@pytest.mark.redis
@pytest.mark.timeout(120)
async def test_the_typing_cap_holds_across_processes(cluster: Cluster) -> None:
    """bob floods typing from a tab on each process: alice, on a third socket, sees one
    notice (the cap lives in Redis; TYPING_EVERY_S long enough that counts, not time, decide)."""
    cluster.env["COLLAB_TYPING_EVERY_S"] = "600"
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    alice, bob = await Browser.login(p1, "alice"), await Browser.login(p1, "bob")
    async with alice.open(p1) as a_ws, bob.open(p1) as b1_ws, bob.open(p2) as b2_ws:
        a, b1, b2 = await opened(Tab(a_ws)), await opened(Tab(b1_ws)), await opened(Tab(b2_ws))
        for _ in range(15):
            await b1.send(action="typing")
            await b2.send(action="typing")
        await b1.post("done on P1")  # each socket's actions run in order: its typing came first
        await b2.post("done on P2")
        for tab in (a, b1, b2):
            await tab.until(lambda t: all(any(m in f for f in t.raw) for m in ("done on P1", "done on P2")))
        notices = [f for f in a.raw if 'id="typing"' in f]
        assert len(notices) == 1 and 'data-user="bob"' in notices[0]
        assert not any('id="typing"' in f for f in b1.raw + b2.raw)  # never to bob's own tabs
