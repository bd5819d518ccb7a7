"""Frames and pages have a byte budget: a room flooded with long messages still opens
(issue "Nothing lost, nobody let in", item 3). The snapshot holds the newest messages
that fit, older ones are paged, long ones are cut with a "show all" button whose view
returns them whole, and a streaming reply's live text keeps its exact offsets."""

from __future__ import annotations

import asyncio
import functools
import html
import json
import os
import re
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.test import Client
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from collab.chat import rendering, room_frames, shared
from collab.chat.markup import render_markdown
from collab.chat.models import Membership, Message, Room
from collab.chat.services import rooms, snapshot
from collab.loadtest.frames import Frames
from collab.loadtest.wire import SNAPSHOT_PREFIX, articles, members
from tests.conftest import World, member
from tests.servers import login, manage, migrate, running_daphne

pytestmark = pytest.mark.django_db(transaction=True)

KIB = 1024
WIRE_LIMIT = 1024 * KIB  # Daphne's WebSocket message limit: over it, close 1011
SNAPSHOT_BYTES = rendering.BUDGETS["SNAPSHOT_BYTES"]
MAX_CHARS = 8000  # the per-message cap (settings.COLLAB["MAX_MESSAGE_CHARS"])
FLOOD = 60  # posts of MAX_CHARS characters, by three members in turn
LONG_AT = 40  # the seq of a 300,000-character reply among them
SHOW_ALL_RE = re.compile(r'hx-get="([^"]+)"[^>]*>Show all')
OLDER_RE = re.compile(r'\?before=(\d+)"')


def size(text: str | bytes) -> int:
    return len(text.encode() if isinstance(text, str) else text)


def words(n: int, seed: int = 0) -> str:
    """n characters of prose: its HTML is about as long as it."""
    vocabulary = ["lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do"]
    out, length, i = [], 0, seed
    while length < n:
        out.append(vocabulary[i % len(vocabulary)])
        length += len(out[-1]) + 1
        i += 7
    return " ".join(out)[:n]


def flood_text(i: int) -> str:
    """A message at the cap: prose (HTML ~8 KB), or ampersands (HTML ~40 KB: `&amp;`)."""
    head = f"post {i}: "
    return head + (words(MAX_CHARS - len(head), i) if i % 2 else "&" * (MAX_CHARS - len(head)))


@functools.cache
def long_reply() -> tuple[str, str]:
    text = words(300_000)
    return text, render_markdown(text)


@functools.cache
def rendered(i: int) -> str:
    return render_markdown(flood_text(i))


def flood(room: Room, authors: list[User], start: int = 1) -> list[Message]:
    """FLOOD posts at the cap, the three authors in turn, and at LONG_AT a finished reply
    of 300,000 characters; stored as the posting path stores them (text and its HTML)."""
    batch = []
    for seq in range(start, start + FLOOD):
        if seq == LONG_AT:
            text, body = long_reply()
            batch.append(
                Message(room=room, seq=seq, role="assistant", author_name="A", text=text, html=body, status="done")
            )
            continue
        who = authors[seq % len(authors)]
        batch.append(
            Message(
                room=room, seq=seq, role="user", author=who, author_name=who.username,
                text=flood_text(seq), html=rendered(seq),
            )
        )  # fmt: skip
    Message.objects.bulk_create(batch)
    Room.objects.filter(pk=room.pk).update(last_seq=start + FLOOD - 1)
    return list(Message.objects.filter(room=room).order_by("seq"))


@pytest.fixture
def crowd(world: World) -> list[User]:
    """The room's three posting members: alice, bob and dave."""
    dave = User.objects.create_user("dave", password="pw-dave-123")
    Membership.objects.create(room=world.room, user=dave)
    return [world.alice, world.bob, dave]


def show_all(fragment: str) -> dict[int, str]:
    """id -> the URL of its "show all" button, for every article that has one."""
    found = {a.msg: SHOW_ALL_RE.findall(a.inner) for a in articles(fragment)}
    return {i: urls[0] for i, urls in found.items() if urls}


def shown(fragment: str) -> dict[int, int]:
    """seq -> id of every article in a frame or page."""
    return {int(a.attrs["data-seq"]): a.msg for a in articles(fragment)}


def cut_of(fragment: str) -> list[int]:
    """The ids of the articles sent cut (data-truncated), in order."""
    return [a.msg for a in articles(fragment) if a.attrs.get("data-truncated") == "1"]


def compact_of(fragment: str) -> list[int]:
    """The ids of the articles whose body is only their "show all" button."""
    return [a.msg for a in articles(fragment) if not a.raw and (a.html or "").startswith('<p class="more">')]


def test_the_flood_is_past_the_wire_limit_unbudgeted(world: World, crowd: list[User]) -> None:
    """The test's premise: the last 50 messages' HTML alone is over 1 MiB."""
    stored = flood(world.room, crowd)
    assert sum(size(m.html) for m in stored[-50:]) > WIRE_LIMIT


async def test_snapshot_of_a_flooded_room_fits_its_budget(world: World, crowd: list[User], memory_layer: None) -> None:
    stored = await database_sync_to_async(flood)(world.room, crowd)
    async with member(world.bob) as m:
        frame = m.raw[0]
    assert size(frame) <= SNAPSHOT_BYTES < WIRE_LIMIT
    assert frame.startswith('<div id="messages" hx-swap-oob="true"') and 'id="members"' in frame
    seqs = sorted(shown(frame))
    assert seqs[-1] == stored[-1].seq  # the newest message is there
    assert seqs == list(range(seqs[0], seqs[-1] + 1))  # no hole
    assert len(seqs) < 50 and OLDER_RE.findall(frame) == [str(seqs[0])]  # the rest is paged
    cut = set(cut_of(frame))
    assert cut  # the ampersand posts (HTML over ARTICLE_BYTES) are cut ...
    assert cut < set(shown(frame).values())  # ... the prose posts are whole
    by_id = {m.id: m for m in stored}
    for msg_id in set(shown(frame).values()) - cut:
        assert by_id[msg_id].html in frame
    assert show_all(frame) == {i: f"m/{i}/" for i in cut}


def test_pages_of_history_hold_every_message_once_within_budget(world: World, crowd: list[User]) -> None:
    """The room page, then "older" pages until there are none: every message exactly once,
    each page within budget, and every cut message's "show all" gives it whole."""
    stored = flood(world.room, crowd)
    client = Client()
    client.force_login(world.bob)
    page = client.get("/r/lab/").content.decode()
    seen = shown(page)
    fragments = [page.split('<div id="messages"', 1)[1].split('<div id="errors"', 1)[0]]
    while before := OLDER_RE.findall(fragments[-1]):
        response = client.get(f"/r/lab/older/?before={before[0]}")
        assert response.status_code == 200
        fragments.append(response.content.decode())
        assert size(response.content) <= SNAPSHOT_BYTES
        older = shown(fragments[-1])
        assert not set(older) & set(seen) and max(older) == int(before[0]) - 1
        seen |= older
    assert len(fragments) >= 2  # 60 messages of up to 300 KB do not fit one page
    assert sorted(seen) == [m.seq for m in stored]
    assert size(fragments[0]) <= SNAPSHOT_BYTES
    by_id = {m.id: m for m in stored}
    cut = [i for f in fragments for i in cut_of(f)]
    long_id = next(m.id for m in stored if m.seq == LONG_AT)
    assert long_id in cut
    for fragment in fragments:
        for msg_id, url in show_all(fragment).items():
            whole = client.get(urllib.parse.urljoin("/r/lab/", url))  # as the browser resolves it
            assert whole.status_code == 200
            body = whole.content.decode()
            assert body.startswith(f'<article id="msg-{msg_id}"') and "data-truncated" not in body
            assert by_id[msg_id].html in body
    assert len(client.get(f"/r/lab/m/{long_id}/").content) > 300_000


def test_show_all_is_for_members_of_that_room_only(world: World, crowd: list[User]) -> None:
    stored = flood(world.room, crowd)
    long_id = next(m.id for m in stored if m.seq == LONG_AT)
    url = f"/r/lab/m/{long_id}/"
    carol = Client()
    carol.force_login(world.carol)
    assert carol.get(url).status_code == 404
    rooms.create_room(world.carol, "Other")
    assert carol.get(f"/r/other/m/{long_id}/").status_code == 404  # her room, not its message
    assert carol.get("/r/other/m/999999/").status_code == 404
    bob = Client()
    bob.force_login(world.bob)
    assert bob.get(url).status_code == 200
    assert {bob.put(url).status_code, bob.post(url).status_code, bob.delete(url).status_code} == {405}
    anonymous = Client().get(url)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")


async def live_snapshot(world: World, text: str, *, at_seq: int | None = None) -> tuple[str, dict[int, float], int]:
    """A flooded room with a reply streaming `text`, at `at_seq` (default: the newest)."""
    seq = at_seq or FLOOD + 1

    def store() -> int:
        crowd = list(User.objects.filter(username__in=["alice", "bob", "dave"]))
        if at_seq is None:
            flood(world.room, crowd)
        else:
            flood(world.room, crowd, start=1)
            Message.objects.filter(room=world.room, seq=at_seq).delete()
        reply = Message.objects.create(room=world.room, seq=seq, role="assistant", author_name="A", status="streaming")
        return reply.id

    reply_id = await database_sync_to_async(store)()
    state = shared.backend()
    await state.begin(reply_id, world.room.id, "test")
    await state.append(reply_id, text, 0)
    messages_html, members_html, floors = await snapshot.snapshot(world.room.id, "lab")
    assert size(messages_html + members_html) <= SNAPSHOT_BYTES
    return messages_html, floors, reply_id


def live_article(frame: str, reply_id: int) -> tuple[dict[str, str], str]:
    (found,) = [a for a in articles(frame) if a.msg == reply_id]
    assert found.raw
    return found.attrs, found.body


async def test_a_huge_live_reply_is_sent_as_its_exact_tail(world: World, crowd: list[User]) -> None:
    text = ("<b>tag</b> & 'quotes' \"here\" é " * 10_000)[:300_000]  # escaping makes it ~2 MB of HTML
    frame, floors, reply_id = await live_snapshot(world, text)
    attrs, body = live_article(frame, reply_id)
    start = int(attrs["data-from"])
    assert attrs["data-length"] == "300000" and floors[reply_id] == 300_000  # the pieces go on at L
    assert 0 < start < 300_000 and body == text[start:]  # exactly the text from data-from to L
    assert f'<p class="earlier" data-from="{start}">' in frame
    assert max(shown(frame)) == FLOOD + 1 and shown(frame)[FLOOD + 1] == reply_id


async def test_an_older_live_reply_is_whole_and_leaves_no_hole(world: World, crowd: list[User]) -> None:
    """A reply streaming 48 messages back: shown with all of its text, and every message
    after it is shown too (some only as a "show all" button)."""
    text = words(5_000)
    frame, floors, reply_id = await live_snapshot(world, text, at_seq=FLOOD - 48)
    attrs, body = live_article(frame, reply_id)
    assert "data-from" not in attrs and attrs["data-length"] == "5000" and body == text
    assert floors[reply_id] == 5000
    seqs = sorted(shown(frame))
    assert seqs[0] <= FLOOD - 48 and seqs == list(range(seqs[0], FLOOD + 1))
    compact = set(compact_of(frame))
    assert compact and compact <= set(cut_of(frame))  # the oldest ones, after the reply
    assert set(show_all(frame)) == set(cut_of(frame))


def test_final_frame_of_a_huge_reply_is_cut(world: World) -> None:
    text, body = long_reply()
    reply = Message.objects.create(
        room=world.room, seq=1, role="assistant", author_name="A", text=text, html=body, status="done", tokens=75_000
    )
    frame = rendering.frame_final(reply)
    assert size(frame) <= rendering.BUDGETS["FRAME_ARTICLE_BYTES"]
    assert frame.startswith(f'<article id="msg-{reply.id}"') and 'hx-swap-oob="true"' in frame
    assert 'data-truncated="1"' in frame and f'hx-get="m/{reply.id}/"' in frame and 'data-tokens="75000"' in frame
    assert html.unescape(re.findall(r'<p class="excerpt">(.*?)&hellip;</p>', frame, re.S)[0]) in text
    reply.text, reply.html = "short", render_markdown("short")
    whole = rendering.frame_final(reply)
    assert "data-truncated" not in whole and "<p>short</p>" in whole


def test_member_list_is_capped_online_first() -> None:
    everyone: list[dict[str, Any]] = [
        {"user_id": i + 1, "username": f"user{i:03}", "role": "member", "online": i >= 495} for i in range(500)
    ]
    frame = room_frames.frame_members(everyone)
    listed = members(frame)
    assert len(listed) == rendering.BUDGETS["MEMBERS_LISTED"]
    assert [u for u, on in listed if on] == [f"user{i}" for i in range(495, 500)]
    assert 'data-more="400"' in frame and size(frame) < 32 * KIB
    small = room_frames.frame_members(everyone[:3])
    assert len(members(small)) == 3 and "data-more" not in small


# --- fault injection over a real Daphne process -------------------------------------------

FLOOD_SETUP = """
from django.contrib.auth.models import User
from collab.chat.services import rooms
from collab.chat.models import Membership
users = [User.objects.create_user(n, password=n + "-pw-123") for n in ("alice", "bob", "dave", "erin")]
room = rooms.create_room(users[0], "Lab")
for u in users[1:]:
    Membership.objects.create(room=room, user=u)
"""
POSTERS = ("alice", "bob", "dave")
POSTS_EACH = 16  # 48 posts of ~40 KB of HTML: about 1.9 MB, past the 1 MiB limit


@pytest.fixture
def flood_daphne(tmp_path: Path) -> Iterator[str]:
    """One Daphne process on SQLite and the in-memory layer, whose posting rate lets a
    member post POSTS_EACH messages at once (the default: a burst of 8)."""
    env = {
        **os.environ,
        "COLLAB_SQLITE_PATH": str(tmp_path / "flood.sqlite3"),
        "DJANGO_SETTINGS_MODULE": "collab.settings",
        "COLLAB_POST_BURST": str(POSTS_EACH + 4),
        "COLLAB_LLM_BASE_URL": "http://127.0.0.1:9/v1",  # no reply is asked for
        "COLLAB_LLM_MODEL": "none",
    }
    env.setdefault("DJANGO_SECRET_KEY", "test-budget-e2e-key")
    env.setdefault("COLLAB_HTTPS", "0")
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    migrate(env)
    manage(env, "shell", "-c", FLOOD_SETUP)
    with running_daphne(env) as server:
        yield server.url


@pytest.mark.e2e
async def test_a_room_flooded_past_the_wire_limit_still_opens(flood_daphne: str) -> None:
    """Three members post 8,000-character messages until the room's last 50 are ~1.9 MB
    of HTML; a member who connects then gets a snapshot under the budget, not a 1011."""
    base = flood_daphne
    ws_url = base.replace("http", "ws") + "/ws/rooms/lab/"
    cookies = await asyncio.gather(*(asyncio.to_thread(login, base, n, f"{n}-pw-123") for n in (*POSTERS, "erin")))

    def socket(cookie: str) -> Any:
        headers = {"Cookie": f"sessionid={cookie}"}
        return connect(ws_url, origin=base, additional_headers=headers, max_size=8 * WIRE_LIMIT)  # type: ignore[arg-type]

    async def post_all(ws: Any, who: str) -> Frames:
        frames = Frames()
        frames.feed(await ws.recv())  # its snapshot
        for i in range(POSTS_EACH):
            text = f"{who} {i} " + "&" * (MAX_CHARS - 20)
            await ws.send(json.dumps({"text": text, "client_id": str(uuid.uuid4()), "HEADERS": {}}))
        while len([r for r in frames.replies.values() if r.role == "user"]) < len(POSTERS) * POSTS_EACH:
            frames.feed(await ws.recv())  # every post, stored and broadcast
            assert not frames.errors, frames.errors
        return frames

    async with socket(cookies[0]) as a, socket(cookies[1]) as b, socket(cookies[2]) as c:
        async with asyncio.timeout(90):
            seen = await asyncio.gather(*(post_all(ws, who) for ws, who in zip((a, b, c), POSTERS, strict=True)))
    posted = {i: r for i, r in seen[0].replies.items() if r.role == "user"}
    newest = max(r.seq for r in posted.values())

    async with socket(cookies[3]) as erin:
        try:
            async with asyncio.timeout(30):
                first = await erin.recv()
        except ConnectionClosed as exc:
            pytest.fail(f"the new socket got no snapshot: closed with {exc.rcvd}")
        assert isinstance(first, str) and first.startswith(SNAPSHOT_PREFIX)
        assert size(first) <= SNAPSHOT_BYTES
        seqs = sorted(shown(first))
        assert seqs[-1] == newest and seqs == list(range(seqs[0], newest + 1)) and seqs[0] > 1
        assert OLDER_RE.findall(first) == [str(seqs[0])] and cut_of(first)
        # The socket stays open and works: its own post comes back.
        await erin.send(json.dumps({"text": "made it in", "client_id": str(uuid.uuid4()), "HEADERS": {}}))
        frames = Frames()
        async with asyncio.timeout(30):
            while not any(r.author == "erin" for r in frames.replies.values()):
                frames.feed(await erin.recv())
