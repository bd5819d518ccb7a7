"""Sockets follow the account on two real server processes (docs/wire.md, "session.ended";
README "Security"): bob's sockets on both processes close (`session.ended`, then 4403) when
staff deactivate him or his password changes, the change made by a third process (a
`manage.py shell`, as the admin would). Real Daphnes, Redis, PostgreSQL (a throwaway
database), the real openai client against the simulated model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from websockets.exceptions import ConnectionClosed

from collab.simulator.app import SimulatorApp
from collab.simulator.testing import running_simulator_app
from tests.cluster import Browser, Cluster, postgres_cluster
from tests.test_multiprocess import closed_with, opened

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(180)]

CHANGES = {
    "deactivated": "u.is_active = False; u.save()",
    "password": "u.set_password('another-pw-789'); u.save()",
}


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[str, SimulatorApp]]:
    with running_simulator_app(tps=300.0, ttft_ms=20, reply_tokens=20, seed=33) as (url, app):
        yield url, app


@pytest.fixture
def cluster(sim: tuple[str, SimulatorApp]) -> Iterator[Cluster]:
    with postgres_cluster(sim[0], "ac") as cluster:
        yield cluster


@pytest.mark.parametrize("change", sorted(CHANGES))
async def test_an_account_change_closes_its_sockets_on_every_process(cluster: Cluster, change: str) -> None:
    p1, p2 = cluster.start("P1"), cluster.start("P2")
    alice, bob = await Browser.login(p1, "alice"), await Browser.login(p2, "bob")
    async with alice.open(p1) as a_ws, bob.open(p1) as b1_ws, bob.open(p2) as b2_ws:
        a, b1, b2 = await opened(a_ws, b1_ws, b2_ws)
        watches = [asyncio.create_task(closed_with(tab, "session.ended")) for tab in (b1, b2)]
        code = f"from django.contrib.auth.models import User; u = User.objects.get(username='bob'); {CHANGES[change]}"
        print("SHELL", await asyncio.to_thread(cluster.manage, "shell", "-c", code + '; print("saved", u.is_active)'))
        for watch in watches:
            closed, _at = await watch
            assert closed == 4403
        # alice's socket is untouched: she still posts, and it is stored.
        await a.post(f"still here after bob's {change}")
        await a.until(
            lambda t: any(
                f"still here after bob&#x27;s {change}" in r or f"still here after bob's {change}" in r for r in t.raw
            )
        )
    # bob's session no longer opens a socket: closed at once, 4403.
    async with bob.open(p2) as again_ws:
        with pytest.raises(ConnectionClosed) as refused:
            await again_ws.recv()
    assert refused.value.rcvd is not None and refused.value.rcvd.code == 4403
