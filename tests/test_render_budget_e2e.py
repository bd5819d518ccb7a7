"""The render budget through a real Daphne and real WebSockets (tests/test_e2e.py's
server): the text that took `systemd`'s lexer minutes, posted from seven tabs at once, is
stored and shown as plain code within the budget, and another member's ordinary post,
sent after them, is shown rendered meanwhile."""

from __future__ import annotations

import asyncio
import html
import json
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
from websockets.asyncio.client import connect

from collab.chat.render_pool import DEFAULT_BUDGET_S
from collab.loadtest import wire
from tests.servers import ROOT, login
from tests.test_e2e import Server, daphne, database, recorded_sim  # noqa: F401 (fixtures)
from tests.test_render_budget import GRACE_S, systemd_post

pytestmark = pytest.mark.e2e

TABS = 7


def user_posts(frame: str) -> dict[int, tuple[str, str]]:
    """The members' posts in a frame: id -> (author, body HTML)."""
    return {
        a.msg: (html.unescape(a.attrs.get("data-author", "")), a.html)
        for a in wire.articles(frame)
        if a.role == "user" and a.html is not None
    }


def stored_posts(server: Server) -> dict[int, dict[str, str]]:
    code = (
        "import json; from collab.chat.models import Message; print(json.dumps({m.id: {'text': m.text, "
        "'html': m.html, 'author': m.author_name} for m in Message.objects.filter(role='user')}))"
    )
    out = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code],
        env=server.env, cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}


async def test_the_systemd_post_from_seven_tabs_is_shown_plain_in_time_and_delays_no_one(daphne: Server) -> None:  # noqa: F811
    text, shown = systemd_post()
    ordinary = "an `ordinary` post"
    cookies = await asyncio.gather(
        asyncio.to_thread(login, daphne.url, "alice", "alice-pw-123"),
        asyncio.to_thread(login, daphne.url, "bob", "bob-pw-123"),
    )
    url = daphne.url.replace("http", "ws") + "/ws/rooms/lab/"

    def open_tab(cookie: str) -> Any:
        return connect(url, origin=daphne.url, additional_headers={"Cookie": f"sessionid={cookie}"}, max_size=2**22)  # type: ignore[arg-type]

    tabs = [await open_tab(cookies[0]) for _ in range(TABS)]
    bob = await open_tab(cookies[1])
    try:
        for ws in (*tabs, bob):
            await ws.recv()  # the snapshot
        sent = time.monotonic()
        for ws in tabs:
            await ws.send(json.dumps({"text": text, "client_id": str(uuid.uuid4()), "HEADERS": {}}))
        await bob.send(json.dumps({"text": ordinary, "client_id": str(uuid.uuid4()), "HEADERS": {}}))
        seen: dict[int, tuple[str, str]] = {}
        arrived: list[int] = []
        # Within the budget (and a loaded machine's grace): before the fix, one of these
        # renders took hours, and the ordinary post waited behind them for a free thread.
        async with asyncio.timeout(DEFAULT_BUDGET_S + GRACE_S + 5):
            while len(seen) < TABS + 1:
                for msg_id, post in user_posts(str(await bob.recv())).items():
                    if msg_id not in seen:
                        seen[msg_id] = post
                        arrived.append(msg_id)
        took = time.monotonic() - sent
    finally:
        for ws in (*tabs, bob):
            await ws.close()

    mine = [i for i in arrived if seen[i][0] == "bob"]
    assert len(mine) == 1
    assert "<code>ordinary</code>" in seen[mine[0]][1]  # rendered: its worker was free
    slow = [i for i in arrived if seen[i][0] == "alice"]
    assert len(slow) == TABS
    assert all(seen[i][1].strip() == shown.strip() for i in slow), seen[slow[0]][1][:200]
    stored = await asyncio.to_thread(stored_posts, daphne)
    assert sorted(stored) == sorted(arrived)
    assert all(stored[i]["text"] == text and stored[i]["html"] == shown for i in slow)
    assert took < DEFAULT_BUDGET_S + GRACE_S + 5
