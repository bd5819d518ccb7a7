"""Admission control (collab/chat/admission.py, docs/wire.md "4429, come back later"):
the bucket on a clock of the test's own, the consumer's 4429 before any database work
(past the rate, and while draining), and a real Daphne sending the hint as the close
reason."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from collab.chat import admission, socket_auth
from collab.chat.lifecycle import runtime
from tests.conftest import World, connected, member
from tests.servers import Daphne, migrate, running_daphne


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the bucket ------------------------------------------------------------------------------


def test_a_burst_of_rate_is_admitted_then_refused_until_it_refills() -> None:
    clock = Clock()
    bucket = admission.Bucket(10, clock)
    assert [bucket.admit() for _ in range(10)] == [None] * 10
    assert bucket.admit() is not None
    clock.now += 0.05  # half a token
    assert bucket.admit() is not None
    clock.now += 0.06  # a whole one: whoever comes first takes it (a promise holds none)
    assert bucket.admit() is None
    assert bucket.admit() is not None
    clock.now += 2.0  # the bucket is full again, no fuller than its burst (10)
    assert [bucket.admit() for _ in range(10)] == [None] * 10
    assert bucket.admit() is not None


def test_refused_sockets_are_each_given_a_later_slot() -> None:
    clock = Clock()
    bucket = admission.Bucket(100, clock)
    for _ in range(100):
        assert bucket.admit() is None
    hints = [bucket.admit() for _ in range(600)]
    assert all(h is not None for h in hints)
    spread = [h for h in hints if h is not None]
    # one slot per 10 ms: the first 25 (10 ms .. 250 ms) say the floor, then 260, 270, ... 6 s
    assert spread[:24] == [admission.MIN_HINT_MS] * 24
    later = spread[25:]
    assert all(a < b for a, b in itertools.pairwise(later))
    assert abs(spread[-1] - 6000) <= 1  # (ceil of a float sum)


def test_hints_are_capped_and_a_rate_of_zero_admits_everyone() -> None:
    clock = Clock()
    slow = admission.Bucket(0.1, clock)  # one socket per 10 s, burst 1
    assert slow.admit() is None
    hints = [slow.admit() for _ in range(5)]
    assert hints == [10_000, 20_000, 30_000, 30_000, 30_000]
    unlimited = admission.Bucket(0, clock)
    assert all(unlimited.admit() is None for _ in range(10_000))


def test_a_socket_that_waited_its_hint_is_admitted() -> None:
    clock = Clock()
    bucket = admission.Bucket(2, clock)
    assert bucket.admit() is None and bucket.admit() is None
    hint = bucket.admit()
    assert hint == 500
    clock.now += hint / 1000
    assert bucket.admit() is None


# --- the consumer: 4429 before any database or layer work ---------------------------------------


@pytest.fixture
def no_room_lookup(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """socket_auth.admit (the connect's first database read), recording its calls."""
    calls: list[Any] = []
    real = socket_auth.admit

    def recording(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(socket_auth, "admit", recording)
    return calls


def retry_ms(out: dict[str, Any]) -> int:
    assert out["type"] == "websocket.close" and out["code"] == admission.CLOSE_COME_BACK_LATER, out
    found = re.fullmatch(r"retry=(\d+)", out.get("reason", ""))
    assert found, out
    return int(found[1])


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("layer", "replies_idle")
async def test_past_the_rate_a_socket_is_closed_4429_with_a_hint(
    world: World, settings: Any, no_room_lookup: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.COLLAB = {**settings.COLLAB, "CONNECT_RATE": 0.1}  # burst 1, then one per 10 s
    monkeypatch.setattr(admission, "_bucket", None)  # a full one, this test's own
    async with member(world.alice) as alice:
        assert alice.frames.snapshots == 1
        async with connected(world.bob, "lab") as (ok, _code, bob):
            assert ok  # accepted, so that the page can read the close code and reason
            hint = retry_ms(await bob.comm.receive_output(timeout=2))
            assert admission.MIN_HINT_MS <= hint <= 10_000
            assert await bob.comm.receive_nothing()  # no snapshot, nothing else
    assert len(no_room_lookup) == 1  # alice's connect only: bob's read nothing


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("layer", "replies_idle")
async def test_a_draining_process_closes_new_sockets_4429_retry_250(
    world: World, no_room_lookup: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "draining", True)
    async with connected(world.alice, "lab") as (ok, _code, alice):
        assert ok
        assert retry_ms(await alice.comm.receive_output(timeout=2)) == admission.DRAINING_HINT_MS == 250
    assert no_room_lookup == []


# --- a real Daphne: the hint is the close frame's reason -----------------------------------------


@pytest.fixture
def tight_daphne(tmp_path: Path) -> Iterator[Daphne]:
    """Daphne admitting one socket per 10 s (burst 1), its metrics open to a token."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "collab.settings",
        "COLLAB_SQLITE_PATH": str(tmp_path / "admission.sqlite3"),
        "COLLAB_CONNECT_RATE": "0.1",
        "COLLAB_METRICS_TOKEN": "admission-test",
    }
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    migrate(env)
    with running_daphne(env) as server:
        yield server


async def close_of(url: str) -> tuple[int | None, str]:
    """Connect (anonymously) and read until the server closes: its code and reason."""
    async with connect(url, origin="http://127.0.0.1") as ws:  # type: ignore[arg-type]
        try:
            while True:
                await ws.recv()
        except ConnectionClosed as closed:
            assert closed.rcvd is not None
            return closed.rcvd.code, closed.rcvd.reason
    raise AssertionError("unreachable")


async def test_daphne_sends_the_hint_as_the_close_reason_and_spreads_them(tight_daphne: Daphne) -> None:
    url = f"ws://127.0.0.1:{tight_daphne.port}/ws/rooms/lab/"
    assert await close_of(url) == (4403, "")  # admitted: anonymous, so not allowed
    closes = [await close_of(url) for _ in range(4)]
    assert [code for code, _ in closes] == [4429] * 4
    hints = [int(reason.removeprefix("retry=")) for _, reason in closes]
    # each later than the one before (a slot of 10 s each), up to the cap
    assert hints[0] < hints[1] < hints[2] <= hints[3] == admission.MAX_HINT_MS, hints
    request = urllib.request.Request(f"{tight_daphne.url}/metrics", headers={"Authorization": "Bearer admission-test"})
    text = (await asyncio.to_thread(urllib.request.urlopen, request)).read().decode()
    assert 'collab_connects_refused_total{reason="rate"} 4.0' in text
    assert "collab_connects_total 1.0" in text
