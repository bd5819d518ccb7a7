"""The live room over a WebSocket: connect checks, posting, parallel streamed replies,
reconnects, stop and regenerate, with the in-memory layer and a real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.db import connection

from collab.chat.generation import registry
from collab.chat.models import Message
from collab.chat.replies import posting
from collab.loadtest.frames import Frames
from tests.conftest import Member, World, all_final, connected, member, reply_ids, stalling

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("layer", "replies_idle")]


async def slow(world: World, handle: str = "a") -> None:
    """Make an assistant's replies take ~0.4 s, so a test can act while one streams."""
    assistant = world.assistants[handle]
    assistant.model = "sim+slow"
    await database_sync_to_async(assistant.save)()


def messages() -> list[Message]:
    return list(Message.objects.order_by("seq"))


amessages = database_sync_to_async(messages)


def assert_integrity(frames: Frames, stored: dict[int, Message]) -> None:
    for msg_id, reply in frames.replies.items():
        if reply.role != "assistant":
            continue
        assert reply.unescaped == 0, msg_id  # TEXT as sent is HTML-escaped (checked before unescaping)
        assert (reply.lost, reply.duplicated, reply.out_of_order) == (0, 0, 0), msg_id
        assert reply.text == stored[msg_id].text, msg_id


# --- connecting ---------------------------------------------------------------------------


async def test_member_gets_snapshot(world: World) -> None:
    async with member(world.alice) as m:
        assert m.frames.snapshots == 1
        assert 'id="members"' in m.raw[0]
        assert "bob" in m.raw[0]


async def test_a_streaming_reply_with_no_live_record_shows_its_checkpoint(world: World) -> None:
    """Its process died (or Redis lost the record): the snapshot shows the text the
    database checkpointed, not an empty reply, until the sweep ends it."""

    def orphan() -> Message:
        question = Message.objects.create(room=world.room, seq=1, role="user", author=world.alice, text="go on")
        return Message.objects.create(
            room=world.room, seq=2, role="assistant", author_name="A", reply_to=question,
            status=Message.Status.STREAMING, text="checkpointed so far",
        )  # fmt: skip

    reply = await database_sync_to_async(orphan)()
    async with member(world.bob) as bob:
        assert f'id="msg-{reply.id}-body"' in bob.raw[0]
        assert "checkpointed so far" in bob.raw[0]


@pytest.mark.parametrize("who", ["carol", "anonymous"])
async def test_non_member_is_accepted_then_closed_4403(world: World, who: str) -> None:
    user = world.carol if who == "carol" else None
    async with connected(user, "lab") as (ok, _code, m):
        assert ok
        out = await m.comm.receive_output(timeout=2)
        assert out == {"type": "websocket.close", "code": 4403}


async def test_unknown_room_is_closed_4403(world: World) -> None:
    async with connected(world.alice, "no-such-room") as (ok, _code, m):
        assert ok
        assert (await m.comm.receive_output(timeout=2))["code"] == 4403


@pytest.mark.parametrize("origin", [b"http://evil.example", None])
async def test_foreign_or_missing_origin_is_refused_at_handshake(world: World, origin: bytes | None) -> None:
    async with connected(world.alice, "lab", origin=origin) as (ok, _code, _m):
        assert not ok


# --- posting ------------------------------------------------------------------------------


async def test_post_is_stored_and_broadcast_to_every_member(world: World) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.post("hello room, no mention")
        for m in (alice, bob):
            await m.until(lambda f: any(r.role == "user" for r in f.replies.values()))
    stored = await amessages()
    assert [(x.seq, x.author_name, x.text) for x in stored] == [(1, "alice", "hello room, no mention")]
    assert len(registry) == 0  # no mention, room not "reply to every message": no reply


async def test_repeated_client_id_posts_once(world: World) -> None:
    async with member(world.alice) as alice:
        cid = str(uuid.uuid4())
        await alice.post("once", client_id=cid)
        await alice.post("once", client_id=cid)
        await alice.post("twice")
        await alice.until(lambda f: len(reply_ids(f, "user")) >= 2)
        await alice.assert_silent()
    assert [x.text for x in await amessages()] == ["once", "twice"]


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"text": ""}, "message.empty"),
        ({"text": "   \n "}, "message.empty"),
        ({"text": "x" * 8001}, "message.too_long"),
        ({"text": 5}, "message.invalid"),
        ({"text": "hi", "client_id": "not-a-uuid"}, "message.invalid_client_id"),
        ({"action": "dance"}, "action.unknown"),
        ({"action": "stop", "message_id": "x"}, "message.invalid_id"),
        ({"action": "stop", "message_id": "²"}, "message.invalid_id"),  # a digit to str.isdigit, not to int()
        ({"action": "stop", "message_id": True}, "message.invalid_id"),
        ({"text": "nul \x00 inside"}, "message.invalid_text"),
        ({"text": "lone \ud800 surrogate"}, "message.invalid_text"),
        ({"action": "stop", "message_id": 999999}, "message.not_found"),
    ],
)
async def test_bad_input_is_an_error_to_the_sender_only(world: World, frame: dict[str, object], code: str) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.send(**frame)
        await alice.until(lambda f: bool(f.errors))
        assert alice.frames.errors[0][0] == code
        await bob.assert_silent()
    assert await amessages() == []


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"text"'])
async def test_malformed_frame_is_an_error(world: World, raw: str) -> None:
    async with member(world.alice) as alice:
        await alice.comm.send_to(text_data=raw)
        await alice.until(lambda f: bool(f.errors))
        assert alice.frames.errors[0][0] == "frame.malformed"
    assert await amessages() == []


async def test_unknown_mention_is_posted_and_sender_told_once(world: World) -> None:
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.post("@nobody @nobody hey @bob, see @Nobody")
        await alice.until(lambda f: bool(f.errors) and bool(reply_ids(f, "user")))
        await alice.assert_silent()
        assert [c for c, _ in alice.frames.errors] == ["mention.unknown"]
        assert "@nobody" in alice.frames.errors[0][1]
        await bob.until(lambda f: bool(reply_ids(f, "user")))
        assert bob.frames.errors == []
    assert [x.text for x in await amessages()] == ["@nobody @nobody hey @bob, see @Nobody"]


async def test_rate_limit(world: World, settings: object) -> None:
    settings.COLLAB = {**settings.COLLAB, "POST_BURST": 3, "POST_REFILL_S": 3600}  # type: ignore[attr-defined]
    async with member(world.bob) as bob:
        for i in range(4):
            await bob.post(f"m{i}")
        await bob.until(lambda f: bool(f.errors) and len(reply_ids(f, "user")) == 3)
        assert bob.frames.errors[0][0] == "rate.limited"
    assert len(await amessages()) == 3


# --- replies ------------------------------------------------------------------------------


async def test_two_assistants_stream_in_parallel_to_two_members(world: World) -> None:
    # Slow replies (~0.4 s, a dozen pieces): a fast one is two pieces in 40 ms, and one
    # piece held up ~25 ms in a loaded Redis (the list-based layer takes 3 round trips per
    # group_send) was enough to show both of A's pieces before B's first.
    await slow(world, "a")
    await slow(world, "b")
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.post("@a @b hello")
        for m in (alice, bob):
            await m.until(lambda f: all_final(f, 2))
    stored = {x.id: x for x in await amessages()}
    replies = [x for x in stored.values() if x.role == "assistant"]
    assert sorted(x.author_name for x in replies) == ["A", "B"]
    assert all(x.status == "done" and x.text and x.tokens and x.ttft_ms is not None for x in replies)
    for m in (alice, bob):
        assert_integrity(m.frames, stored)
        a, b = (m.frames.replies[x.id] for x in replies)
        # Interleaved: each reply's first piece came before the other's last piece.
        assert a.first_piece_at is not None and b.first_piece_at is not None
        assert a.first_piece_at < b.piece_times[-1][1] and b.first_piece_at < a.piece_times[-1][1]
        assert a.pieces > 1 and b.pieces > 1
        for r in (a, b):
            assert r.final_attrs["data-status"] == "done"
            assert {"data-ttft-ms", "data-tokens", "data-tps"} <= set(r.final_attrs)


async def test_all_mention_and_reply_to_every_message(world: World) -> None:
    async with member(world.alice) as alice:
        await alice.post("@all what now?")
        await alice.until(lambda f: all_final(f, 2))
        world.room.reply_to_all = True
        await database_sync_to_async(world.room.save)()
        await alice.post("no mention here")
        await alice.until(lambda f: all_final(f, 4))
    stored = await amessages()
    assert [x.role for x in stored] == ["user", "assistant", "assistant", "user", "assistant", "assistant"]
    assert [x.seq for x in stored] == [1, 2, 3, 4, 5, 6]


async def test_reply_outlives_the_askers_socket(world: World) -> None:
    await slow(world)
    async with member(world.bob) as bob:
        async with member(world.alice) as alice:
            await alice.post("@a tell me a story")
            await alice.until(lambda f: any(r.pieces for r in f.replies.values()))
        # Alice closed her tab mid-reply; the reply goes on for Bob and is stored.
        await bob.until(lambda f: all_final(f, 1))
    stored = {x.id: x for x in await amessages()}
    reply = next(x for x in stored.values() if x.role == "assistant")
    assert reply.status == "done"
    assert_integrity(bob.frames, stored)


MARKUP_TOKENS = ["Tom", " &", " Jerry", " say", " <hi>", " &amp;", " a<b>c", " &#39;", ' "q"', " 1 > 0", ".\n\n"]


@pytest.fixture
def markup_model(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The simulated model (in this process) answering with `<`, `>`, `&` and entities."""
    from collab.simulator import reply

    def tokens(messages: object, seed: int = 0, model: str = "sim", n: int = 120) -> Iterator[str]:
        return iter((MARKUP_TOKENS * (n // len(MARKUP_TOKENS) + 1))[:n])

    monkeypatch.setattr(reply, "iter_tokens", tokens)
    return MARKUP_TOKENS


async def test_reply_text_is_escaped_in_pieces_and_snapshots(world: World, markup_model: list[str]) -> None:
    """TEXT is HTML-escaped (docs/wire.md), in a piece and in a streaming reply's snapshot: the
    client's checker reads each as sent before unescaping, so text with `<hi>` or a bare
    `&` sent raw is caught even though it would unescape to the same characters."""
    await slow(world)
    async with member(world.alice) as alice:
        await alice.post("@a say something with markup")
        # Pieces that hold the markup (not a count of pieces: how many tokens a piece holds
        # depends on where the window's tick falls, coalescer.WindowClock).
        await alice.until(lambda f: any(r.role == "assistant" and "<hi>" in r.text for r in f.replies.values()))
        async with member(world.bob) as late:  # joins mid-reply: the text so far in its snapshot
            [reply] = [r for r in late.frames.replies.values() if r.role == "assistant"]
            assert reply.status == "streaming" and "<hi>" in reply.text
            await late.until(lambda f: all_final(f, 1))
        await alice.until(lambda f: all_final(f, 1))
    stored = {x.id: x for x in await amessages()}
    assert "<hi> &amp; a<b>c" in stored[reply.id].text
    assert_integrity(alice.frames, stored)
    assert_integrity(late.frames, stored)


async def test_reconnect_mid_reply_continues_from_the_snapshot(world: World) -> None:
    await slow(world)
    async with member(world.alice) as alice:
        await alice.post("@a a long answer please")
        await alice.until(lambda f: any(r.pieces >= 2 for r in f.replies.values()))
        async with member(world.bob) as late:
            live = [(r.id, r.status, len(r.text)) for r in late.frames.replies.values() if r.role == "assistant"]
            await late.until(lambda f: all_final(f, 1))
        await alice.until(lambda f: all_final(f, 1))
    stored = {x.id: x for x in await amessages()}
    assert_integrity(late.frames, stored)
    assert_integrity(alice.frames, stored)
    # The late member joined mid-reply: it saw the text so far, then the rest as pieces.
    [(reply_id, status, length_at_connect)] = live
    assert status == "streaming" and length_at_connect > 0
    assert f'data-length="{length_at_connect}"' in late.raw[0]
    assert late.frames.replies[reply_id].pieces >= 1


async def test_stop_keeps_partial_text(world: World) -> None:
    await slow(world)
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.post("@a go on and on")
        await alice.until(lambda f: any(r.pieces for r in f.replies.values() if r.role == "assistant"))
        reply_id = reply_ids(alice.frames)[0]
        await bob.send(action="stop", message_id=reply_id)  # not the asker, not the owner
        await bob.until(lambda f: bool(f.errors))
        assert bob.frames.errors[0][0] == "reply.forbidden"
        await alice.send(action="stop", message_id=reply_id)
        await alice.until(lambda f: all_final(f, 1))
    reply = await database_sync_to_async(Message.objects.get)(pk=reply_id)
    assert reply.status == "stopped"
    assert alice.frames.replies[reply_id].text == reply.text


async def test_stop_all_stops_every_reply_of_the_room(world: World) -> None:
    from collab.chat.services import streams

    await stalling(world, "a", "b")
    async with member(world.alice) as alice:
        await alice.post("@a @b both of you, at length")
        await alice.until(lambda f: sum(1 for r in f.replies.values() if r.role == "assistant" and r.pieces) == 2)
        await streams.stop_all(world.room.pk)
        await alice.until(lambda f: all_final(f, 2))
    statuses = await database_sync_to_async(list)(
        Message.objects.filter(role="assistant").values_list("status", flat=True)
    )
    assert statuses == ["stopped", "stopped"]


async def test_a_reply_ended_elsewhere_takes_no_more_pieces_from_its_owner(world: World) -> None:
    """An owner that stalled past its lease while another process interrupted its reply
    (here: interrupt() called beside the running reply) adds nothing after the final
    article, and does not overwrite the stored outcome."""
    from collab.chat.generation import registry
    from collab.chat.replies.interrupt import interrupt

    await slow(world)
    async with member(world.alice) as alice:
        await alice.post("@a keep talking")
        await alice.until(lambda f: any(r.pieces >= 2 for r in f.replies.values() if r.role == "assistant"))
        reply_id = reply_ids(alice.frames)[0]
        owner = registry.get(reply_id)
        assert owner is not None and owner.task is not None
        await interrupt(reply_id)
        await alice.until(lambda f: bool(f.replies[reply_id].final_attrs))
        pieces = alice.frames.replies[reply_id].pieces
        await owner.task  # the owner runs to its end meanwhile
        await alice.assert_silent()
    assert alice.frames.replies[reply_id].pieces == pieces
    stored = await database_sync_to_async(Message.objects.get)(pk=reply_id)
    assert stored.status == "interrupted"
    assert alice.frames.replies[reply_id].final_attrs["data-status"] == "interrupted"


async def test_regenerate_adds_a_new_reply(world: World) -> None:
    async with member(world.bob) as bob:
        await bob.post("@b first")
        await bob.until(lambda f: all_final(f, 1))
        first = reply_ids(bob.frames)[0]
        await bob.send(action="regenerate", message_id=first)
        await bob.until(lambda f: all_final(f, 2))
    stored = await amessages()
    assert [(x.seq, x.role) for x in stored] == [(1, "user"), (2, "assistant"), (3, "assistant")]
    assert stored[2].reply_to_id == stored[0].id


async def test_leaving_closes_the_members_sockets(world: World) -> None:
    from collab.chat.services import rooms

    async with connected(world.bob, "lab") as (ok, _code, bob):
        assert ok
        await bob.until(lambda f: f.snapshots == 1)
        await database_sync_to_async(rooms.leave_room)(world.bob, world.room)
        await bob.until(lambda f: bool(f.errors))
        assert bob.frames.errors[-1][0] == "room.left"
        assert (await bob.comm.receive_output(timeout=2))["code"] == 4403


async def test_logging_out_closes_that_sessions_sockets_only(world: World) -> None:
    from django.test import Client

    from tests.conftest import session_cookie

    cookie = await database_sync_to_async(session_cookie)(world.bob)
    async with connected(world.bob, "lab", cookie=cookie) as (ok, _code, tab), member(world.bob) as other_browser:
        assert ok
        await tab.until(lambda f: f.snapshots == 1)
        browser = Client()
        browser.cookies["sessionid"] = cookie
        response = await database_sync_to_async(browser.post)("/accounts/logout/")
        assert response.status_code == 302
        await tab.until(lambda f: bool(f.errors))
        assert tab.frames.errors[-1][0] == "session.ended"
        assert (await tab.comm.receive_output(timeout=2))["code"] == 4403
        await other_browser.assert_silent()  # bob's other session stays open


async def test_a_session_that_expires_closes_its_sockets(world: World) -> None:
    from datetime import timedelta

    from django.contrib.sessions.models import Session
    from django.utils import timezone

    from tests.conftest import session_cookie

    cookie = await database_sync_to_async(session_cookie)(world.bob)
    soon = timezone.now() + timedelta(seconds=1)
    await database_sync_to_async(Session.objects.filter(session_key=cookie).update)(expire_date=soon)
    async with connected(world.bob, "lab", cookie=cookie) as (ok, _code, tab):
        assert ok
        await tab.until(lambda f: bool(f.errors), timeout=15)  # no action of bob's: the session's own end
        assert tab.frames.errors[-1][0] == "session.ended"
        assert (await tab.comm.receive_output(timeout=2))["code"] == 4403


@contextlib.contextmanager
def posting_from_elsewhere(world: World, n: int) -> Iterator[threading.Event]:
    """Another writer of the room (as another server process would be): its own thread and
    database connection, posting `n` messages once the event it yields is set."""
    started = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            started.wait()
            for i in range(n):
                posting.store_post(world.bob.pk, world.room.pk, f"elsewhere {i}", None)
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield started
    finally:
        started.set()
        thread.join(30)
    assert not thread.is_alive() and not failures, failures


async def test_every_member_sees_every_message_at_its_stored_seq(world: World) -> None:
    """Two members post at once over their sockets (every third post mentions @a: its reply
    takes the next seq), while another writer posts straight to the database. Stored, the
    seqs of all writers together are 1..N, none shared, none skipped, each reply right
    after its post; each socket's posts are in the order it sent them. On the wire, each
    member is shown every message of the sockets once, under the seq it was stored with,
    and a member who connects afterwards gets all N in seq order."""
    texts = {"alice": [f"alice {i}" for i in range(6)], "bob": [f"bob {i}" for i in range(6)]}
    texts = {who: [f"@a {t}" if i % 3 == 0 else t for i, t in enumerate(ts)] for who, ts in texts.items()}

    async def send(m: Member, who: str) -> None:
        for text in texts[who]:
            await m.post(text)

    with posting_from_elsewhere(world, 6) as started:
        async with member(world.alice) as alice, member(world.bob) as bob:
            started.set()
            await asyncio.gather(send(alice, "alice"), send(bob, "bob"))
            for m in (alice, bob):
                await m.until(lambda f: len(reply_ids(f, "user")) == 12 and all_final(f, 4))
    stored = await amessages()
    seqs = [x.seq for x in stored]
    assert seqs == list(range(1, 6 + 12 + 4 + 1))
    by_seq = {x.seq: x for x in stored}
    for x in stored:
        if x.role == "user" and x.text.startswith("@a"):
            assert by_seq[x.seq + 1].role == "assistant", x.text
    for who, sent in texts.items():
        own = [x.seq for x in stored if x.role == "user" and x.author_name == who and not x.text.startswith("else")]
        assert [by_seq[s].text for s in own] == sent  # in the order sent
    socket_messages = {x.id: x.seq for x in stored if not x.text.startswith("elsewhere")}
    for m in (alice, bob):
        assert {i: r.seq for i, r in m.frames.replies.items()} == socket_messages
    async with member(world.alice) as late:
        assert [r.seq for r in late.frames.replies.values()] == seqs
        assert {i: r.seq for i, r in late.frames.replies.items()} == {x.id: x.seq for x in stored}


async def test_a_sockets_actions_apply_in_the_order_sent(world: World) -> None:
    """A long message (slow to render) sent first is stored first: one socket's actions
    run one at a time, in order, whatever each one costs."""
    long_text = "\n".join(f"- item **{i}** with `code {i}` and [a link](https://example.com/{i})" for i in range(600))
    async with member(world.alice) as alice:
        await alice.post(long_text[:7900])
        await alice.post("SECOND")
        await alice.until(lambda f: len(reply_ids(f, "user")) == 2)
    stored = await amessages()
    assert [(m.seq, m.text == "SECOND") for m in stored] == [(1, False), (2, True)]


async def test_sweep_interrupts_replies_no_process_runs(world: World) -> None:
    """A reply left `streaming` by a process that died, with no lease, is ended
    `interrupted` with the text it had, and every member sees its final article; one
    too young to judge (it may be starting elsewhere) is left alone."""
    from datetime import timedelta

    from django.utils import timezone

    from collab.chat.lifecycle import sweep_once

    def make() -> tuple[int, int]:
        kw = {"room": world.room, "role": "assistant", "assistant": world.assistants["a"], "author_name": "A"}
        old = Message.objects.create(seq=1, status="streaming", text="half", **kw)
        Message.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(hours=1))
        recent = Message.objects.create(seq=2, status="streaming", text="other process", **kw)
        return old.pk, recent.pk

    old, recent = await database_sync_to_async(make)()
    async with member(world.alice) as alice:
        assert alice.frames.replies[old].status == "streaming"
        assert await sweep_once() == [old]
        await alice.until(lambda f: f.replies[old].status == "interrupted")
        assert alice.frames.replies[recent].status == "streaming"
    stored = await database_sync_to_async(Message.objects.get)(pk=old)
    assert (stored.status, stored.text) == ("interrupted", "half")
    assert "half" in stored.html
    assert await sweep_once() == []  # once only


async def test_metrics_count_replies_frames_and_sockets(world: World) -> None:
    from collab.chat import metrics

    def value(metric: Any, *labels: str) -> float:
        target = metric.labels(*labels) if labels else metric
        return float(target._value.get())

    done, deltas, sockets = value(metrics.REPLIES, "done"), value(metrics.FRAMES, "delta"), value(metrics.SOCKETS)
    async with member(world.alice) as alice:
        assert value(metrics.SOCKETS) == sockets + 1
        await alice.post("@a count me")
        await alice.until(lambda f: all_final(f, 1))
        reply = next(r for r in alice.frames.replies.values() if r.role == "assistant")
    assert value(metrics.REPLIES, "done") == done + 1
    assert value(metrics.FRAMES, "delta") == deltas + reply.pieces
    assert value(metrics.SOCKETS) == sockets
