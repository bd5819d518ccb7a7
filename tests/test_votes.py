"""Votes on assistants' replies, and what they decide (docs/wire.md, "vote";
docs/architecture.md#a-votes): over real WebSocket clients, the real openai client and
the simulated model (its recorded requests show what history the next turn was sent).
The cross-process case is in tests/test_votes_cluster.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.test import AsyncClient, Client
from django.urls import reverse

from collab.chat.generation import registry
from collab.chat.models import Membership, Message, Room, Vote
from collab.chat.replies import early
from tests.conftest import Member, World, all_final, connected, member, stalling

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("replies_idle", "memory_layer"),
]


@contextlib.asynccontextmanager
async def tabs(*users: User) -> AsyncIterator[list[Member]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(member(u)) for u in users]


async def settle() -> None:
    async with asyncio.timeout(30):
        await registry.wait_idle()


async def ask(m: Member, text: str, n: int) -> list[Message]:
    """Post `text`; once its `n` replies have ended, them (stored), in seq order."""
    before = len([r for r in m.frames.replies.values() if r.role == "assistant" and r.final_attrs])
    await m.post(text)
    await m.until(lambda f: all_final(f, before + n))
    await settle()
    question = await Message.objects.filter(role="user").order_by("-seq").afirst()
    assert question is not None
    return [r async for r in Message.objects.filter(reply_to=question).order_by("seq")]


async def tag_texts(replies: list[Message]) -> list[str]:
    """Give each reply a text of its own (the simulator may answer alike)."""
    tags = []
    for r in replies:
        tag = f"ANSWER-{r.author_name}-{uuid.uuid4().hex[:8]}"
        await Message.objects.filter(pk=r.pk).aupdate(text=tag, html=f"<p>{tag}</p>")
        tags.append(tag)
    if replies:  # written behind the app's back: said as a change without a frame is (chat/replies/early.py)
        await database_sync_to_async(early.changed)(replies[0].room_id)
    return tags


def bar_of(m: Member, reply_id: int, since: int = 0) -> str | None:
    """The last vote bar of this reply the socket got (after frame `since`)."""
    needle = f'id="msg-{reply_id}-votes"'
    found = [r for r in m.raw[since:] if needle in r and "<article" not in r]
    return found[-1] if found else None


async def voted(m: Member, reply_id: int, value: str, *watchers: Member, up: int, down: int) -> None:
    """Vote, then wait for the bar with these counts on the voter's and every watcher's socket."""
    marks = {id(w): len(w.raw) for w in (m, *watchers)}
    await m.send(action="vote", message_id=reply_id, value=value)
    counts = f'data-votes-up="{up}" data-votes-down="{down}"'
    for w in (m, *watchers):
        await w.until(lambda f, w=w: counts in (bar_of(w, reply_id, marks[id(w)]) or ""))


async def refused(m: Member, **frame: Any) -> str:
    n = len(m.frames.errors)
    await m.send(**frame)
    await m.until(lambda f: len(f.errors) > n)
    return m.frames.errors[n][0]


async def state(reply_id: int) -> tuple[int, int, str, int]:
    message = await Message.objects.aget(pk=reply_id)
    return message.votes_up, message.votes_down, message.verdict, await Vote.objects.filter(message=message).acount()


def add_member(world: World, name: str, role: str = Membership.Role.MEMBER) -> User:
    user = User.objects.create_user(name, password=f"pw-{name}-123")
    Membership.objects.create(room=world.room, user=user, role=role)
    return user


aadd_member = database_sync_to_async(add_member)


def _get(user: User, url: str, params: dict[str, Any] | None = None) -> str:
    c = Client()
    c.force_login(user)
    return c.get(url, params or {}).content.decode()


get = sync_to_async(_get)


def recorded_with(sim: tuple[str, Any], needle: str) -> list[str]:
    return [str(r["messages"]) for r in list(sim[1].recorded) if needle in str(r["messages"])]


# --- counting ------------------------------------------------------------------------------


async def test_a_vote_is_counted_once_per_member_and_a_change_replaces_it(world: World) -> None:
    async with tabs(world.alice, world.bob) as (alice, bob):
        reply, _ = await ask(alice, "@a @b which database?", 2)
        await voted(alice, reply.id, "up", bob, up=1, down=0)
        await voted(alice, reply.id, "up", bob, up=1, down=0)  # again: still one
        assert await state(reply.id) == (1, 0, "approved", 1)
        await voted(bob, reply.id, "up", alice, up=2, down=0)
        await voted(bob, reply.id, "down", alice, up=1, down=1)  # changed: replaced
        assert await state(reply.id) == (1, 1, "", 2)
        await voted(alice, reply.id, "down", bob, up=0, down=2)
        assert await state(reply.id) == (0, 2, "rejected", 2)
        await voted(alice, reply.id, "none", bob, up=0, down=1)  # taken back
        assert await state(reply.id) == (0, 1, "rejected", 1)
        vote = await Vote.objects.aget(message=reply)
        assert (vote.voter_id, vote.voter_name, vote.value) == (world.bob.id, "bob", "down")
        assert vote.at is not None
        frame = bar_of(alice, reply.id) or ""
        assert 'data-down-by="bob"' in frame and 'data-up-by=""' in frame  # the pressed state (room.html CSS)
        assert 'title="down: bob"' in frame and 'data-verdict="rejected"' in frame
        assert 'hx-swap-oob="true"' in frame and 'class="link reopen"' in frame


async def test_the_room_page_marks_verdicts_and_folds_rejected_replies(world: World) -> None:
    async with tabs(world.alice, world.bob) as (alice, bob):
        good, bad = await ask(alice, "@a @b which cache?", 2)
        await voted(alice, good.id, "up", bob, up=1, down=0)
        await voted(bob, bad.id, "down", alice, up=0, down=1)
    html = await get(world.bob, reverse("room", args=["lab"]))
    assert f'id="msg-{good.id}"' in html and 'data-verdict="approved"' in html
    article = html[html.index(f'<article id="msg-{bad.id}"') :]
    assert article.index('data-verdict="rejected"') < article.index(">")
    assert 'data-votes-up="0" data-votes-down="1"' in article[: article.index(">")]
    assert "Show the rejected reply" in article[: article.index("</article>")]
    assert ".votes[data-up-by~=" in html  # the viewer's own vote, pressed by CSS


async def test_a_vote_on_a_streaming_reply_counts_once_it_ends(world: World) -> None:
    await stalling(world, "a")
    async with tabs(world.alice, world.bob) as (alice, bob):
        await alice.post("@a slow one")
        await alice.until(lambda f: any(r.role == "assistant" for r in f.replies.values()))
        reply = await Message.objects.aget(role="assistant")
        assert reply.status == "streaming"
        await bob.send(action="vote", message_id=reply.id, value="up")
        async with asyncio.timeout(15):
            while not await Vote.objects.filter(message=reply).aexists():
                await bob.pump()
        await alice.send(action="stop", message_id=reply.id)
        await bob.until(lambda f: all_final(f, 1))
        final = bob.frames.replies[reply.id].final_attrs
        assert final.get("data-votes-up") == "1" and final.get("data-verdict") == "approved"


# --- what the votes decide: the next turn -----------------------------------------------------


async def test_the_next_request_holds_the_approved_answers_and_not_the_rejected(
    world: World, sim: tuple[str, Any]
) -> None:
    async with tabs(world.alice, world.bob) as (alice, bob):
        first, second = await ask(alice, "@a @b plan one?", 2)
        approved, unvoted = await tag_texts([first, second])
        (lone,) = await ask(alice, "@a plan two?", 1)
        (rejected,) = await tag_texts([lone])
        await voted(bob, first.id, "up", alice, up=1, down=0)
        await voted(bob, lone.id, "down", alice, up=0, down=1)
        tag = uuid.uuid4().hex
        await ask(alice, f"@a next step {tag}", 1)
        (sent,) = recorded_with(sim, tag)
        assert approved in sent
        assert unvoted not in sent  # its sibling is approved, and nobody voted on it
        assert rejected not in sent
        assert "plan one?" in sent and "plan two?" in sent  # the questions stay
        # The owner has the room keep rejected replies in history (its settings page): the
        # rejected one is back in the next request, and in no request sent before it.
        unchecked = {"votes-voters": "members", "votes-approval": "voters"}  # rejected_left_out: unchecked
        assert await sync_to_async(settings_post)(world.alice, unchecked) == 302
        tag = uuid.uuid4().hex
        await ask(alice, f"@a again {tag}", 1)
        (sent,) = recorded_with(sim, tag)
        assert approved in sent and rejected in sent and unvoted not in sent


async def test_without_an_approved_sibling_every_answer_stays_in_history(world: World, sim: tuple[str, Any]) -> None:
    async with member(world.alice) as alice:
        first, second = await ask(alice, "@a @b plan?", 2)
        one, two = await tag_texts([first, second])
        tag = uuid.uuid4().hex
        await ask(alice, f"@a next {tag}", 1)
        (sent,) = recorded_with(sim, tag)
        assert one in sent and two in sent


# --- who may vote, on what -------------------------------------------------------------------


async def test_votes_from_members_without_the_right_are_refused_and_change_nothing(world: World) -> None:
    async with tabs(world.alice, world.bob) as (alice, bob):
        reply, other = await ask(alice, "@a @b vote?", 2)
        await voted(alice, reply.id, "up", bob, up=1, down=0)
        await Room.objects.filter(pk=world.room.pk).aupdate(voters=Room.Voters.MODERATORS)
        for value in ("up", "down", "none"):
            assert await refused(bob, action="vote", message_id=reply.id, value=value) == "vote.forbidden"
        assert await state(reply.id) == (1, 0, "approved", 1)
        await voted(alice, other.id, "down", bob, up=0, down=1)  # the owner still votes
        await bob.assert_silent()


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"value": "sideways"}, "vote.invalid"),
        ({"value": 1}, "vote.invalid"),
        ({"value": None}, "vote.invalid"),
        ({"message_id": "x1"}, "message.invalid_id"),
        ({"message_id": True}, "message.invalid_id"),
        ({"message_id": 10**9}, "message.not_found"),
        ({"question": True}, "vote.not_reply"),
    ],
)
async def test_a_bad_vote_is_refused_and_changes_nothing(world: World, frame: dict[str, Any], code: str) -> None:
    async with member(world.alice) as alice:
        (reply,) = await ask(alice, "@a one?", 1)
        target = reply.reply_to_id if frame.pop("question", False) else reply.id
        sent = {"action": "vote", "message_id": target, "value": "up", **frame}
        assert await refused(alice, **sent) == code
        await alice.assert_silent()
    assert await Vote.objects.acount() == 0
    assert await state(reply.id) == (0, 0, "", 0)


async def test_a_reply_of_another_room_does_not_exist_here(world: World) -> None:
    other = await Room.objects.acreate(name="Other", slug="other", owner=world.alice)
    await Membership.objects.acreate(room=other, user=world.alice, role=Membership.Role.OWNER)
    async with member(world.alice) as alice:
        (reply,) = await ask(alice, "@a here?", 1)
    async with member(world.alice, "other") as there:
        assert await refused(there, action="vote", message_id=reply.id, value="up") == "message.not_found"
    assert await Vote.objects.acount() == 0


async def test_a_vote_from_staff_viewing_the_room_is_refused(world: World) -> None:
    staff = await sync_to_async(User.objects.create_user)("dave", password="pw-dave-123", is_staff=True)
    async with member(world.alice) as alice:
        (reply,) = await ask(alice, "@a staff?", 1)
        async with connected(staff, "lab") as (ok, _code, viewer):
            assert ok
            await viewer.until(lambda f: f.snapshots == 1)
            assert await refused(viewer, action="vote", message_id=reply.id, value="up") == "room.read_only"
        await alice.assert_silent()
    assert await state(reply.id) == (0, 0, "", 0)


@pytest.mark.parametrize("status", [Room.Status.LOCKED, Room.Status.ARCHIVED])
async def test_no_votes_in_a_locked_or_archived_room(world: World, status: str) -> None:
    async with member(world.alice) as alice:
        (reply,) = await ask(alice, "@a locked?", 1)
        await voted(alice, reply.id, "up", up=1, down=0)
        await Room.objects.filter(pk=world.room.pk).aupdate(status=status)
        for value in ("down", "none"):
            assert await refused(alice, action="vote", message_id=reply.id, value=value) == f"room.{status}"
    assert await state(reply.id) == (1, 0, "approved", 1)  # the verdict stands


async def test_an_unshared_personal_reply_takes_votes_from_its_recipient_alone(world: World) -> None:
    await Membership.objects.filter(room=world.room, user=world.bob).aupdate(lens="in Spanish")
    async with tabs(world.alice, world.bob) as (alice, bob):
        await alice.post("/each @a hello")
        await bob.until(lambda f: all_final(f, 1))
        await settle()
        personal = await Message.objects.aget(role="assistant", recipient=world.bob)
        for value in ("up", "down", "none"):
            assert await refused(alice, action="vote", message_id=personal.id, value=value) == "message.not_found"
        assert await state(personal.id) == (0, 0, "", 0)
        await voted(bob, personal.id, "up", up=1, down=0)  # its recipient may
        assert bar_of(alice, personal.id) is None  # and nobody else hears of it
        await bob.send(action="share", message_id=personal.id)
        await alice.until(lambda f: personal.id in f.replies)
        await voted(alice, personal.id, "up", bob, up=2, down=0)  # shared: the room's


async def test_the_online_rule_needs_more_than_half_the_members_online(world: World) -> None:
    await Room.objects.filter(pk=world.room.pk).aupdate(approval=Room.Approval.ONLINE)
    await aadd_member(world, "dave")  # a member, not online
    async with tabs(world.alice, world.bob) as (alice, bob):
        reply, _ = await ask(alice, "@a @b online?", 2)
        await voted(alice, reply.id, "up", bob, up=1, down=0)
        assert (await state(reply.id))[2] == ""  # 1 of 2 online: not more than half
        await voted(bob, reply.id, "up", alice, up=2, down=0)
        assert (await state(reply.id))[2] == "approved"


# --- settings and records ----------------------------------------------------------------


def _post(user: User, url: str, data: dict[str, str]) -> int:
    c = Client()
    c.force_login(user)
    return c.post(url, data).status_code


def settings_post(user: User, data: dict[str, str]) -> int:
    return _post(user, reverse("room_settings", args=["lab"]), {"op": "votes", **data})


async def test_the_owner_sets_who_votes_and_the_rule_and_the_settings_apply(world: World) -> None:
    data = {"votes-voters": "moderators", "votes-approval": "online"}  # rejected_left_out: unchecked
    assert await sync_to_async(settings_post)(world.bob, data) == 403  # a member: refused
    assert (await Room.objects.aget(pk=world.room.pk)).voters == "members"
    assert await sync_to_async(settings_post)(world.alice, {**data, "votes-voters": "everyone"}) == 400
    assert await sync_to_async(settings_post)(world.alice, data) == 302
    room = await Room.objects.aget(pk=world.room.pk)
    assert (room.voters, room.approval, room.rejected_left_out) == ("moderators", "online", False)
    page = await get(world.alice, reverse("room_settings", args=["lab"]))
    assert 'id="vote-settings"' in page and 'name="votes-voters"' in page and 'name="votes-approval"' in page
    async with tabs(world.alice, world.bob) as (alice, bob):
        (reply,) = await ask(alice, "@a settings?", 1)
        assert await refused(bob, action="vote", message_id=reply.id, value="up") == "vote.forbidden"
        await voted(alice, reply.id, "up", bob, up=1, down=0)


async def test_the_export_holds_each_replys_votes(world: World) -> None:
    async with tabs(world.alice, world.bob) as (alice, bob):
        reply, _ = await ask(alice, "@a @b export?", 2)
        await voted(alice, reply.id, "up", bob, up=1, down=0)
        await voted(bob, reply.id, "down", alice, up=1, down=1)
    c = AsyncClient()
    await c.aforce_login(world.bob)
    response = await c.get("/r/lab/export.json")
    body = b"".join([chunk async for chunk in response.streaming_content])
    rows = {m["id"]: m for m in json.loads(body)["messages"]}
    votes = rows[reply.id]["votes"]
    assert (votes["up"], votes["down"], votes["verdict"]) == (1, 1, None)
    assert [(v["voter"], v["value"]) for v in votes["by"]] == [("alice", "up"), ("bob", "down")]
    assert all(v["at"] for v in votes["by"])
    assert rows[reply.reply_to_id]["votes"] is None
    response = await c.get("/r/lab/export.md")
    text = b"".join([chunk async for chunk in response.streaming_content]).decode()
    assert "> votes: 1 up (alice), 1 down (bob)" in text


async def test_the_admin_lists_votes_per_room(world: World) -> None:
    async with tabs(world.alice, world.bob) as (alice, bob):
        reply, _ = await ask(alice, "@a @b admin?", 2)
        await voted(bob, reply.id, "up", alice, up=1, down=0)
    staff = await sync_to_async(User.objects.create_superuser)("root", "root@example.com", "pw-root-123")
    url = reverse("admin:chat_vote_changelist")
    page = await get(staff, url, {"message__room__id__exact": world.room.pk})
    assert '<td class="field-voter_name">bob</td>' in page and "Lab" in page
    other = await Room.objects.acreate(name="Elsewhere", slug="elsewhere", owner=world.alice)
    page = await get(staff, url, {"message__room__id__exact": other.pk})
    assert "field-voter_name" not in page  # filtered by room: none there
    vote = await Vote.objects.aget()
    change = await sync_to_async(_post)(staff, reverse("admin:chat_vote_change", args=[vote.pk]), {"value": "down"})
    assert change == 403 and (await Vote.objects.aget()).value == "up"  # read-only
    room_form = await get(staff, reverse("admin:chat_room_change", args=[world.room.pk]))
    assert 'name="voters"' in room_form and 'name="approval"' in room_form and 'name="rejected_left_out"' in room_form


async def test_a_flood_of_votes_is_capped_and_the_counts_stay_true(world: World) -> None:
    async with member(world.bob) as bob:
        (reply,) = await ask(bob, "@a flood?", 1)
        for i in range(25):  # well past the burst, faster than the refill
            await bob.send(action="vote", message_id=reply.id, value="up" if i % 2 else "down")
        await bob.until(lambda f: any(code == "rate.limited" for code, _ in f.errors))
        while not await bob.comm.receive_nothing(timeout=0.5):  # the rest of the answers
            await bob.pump()
    up, down, _, rows = await state(reply.id)
    assert rows == 1 and up + down == 1  # one vote, whatever the last one taken was
    assert all(code == "rate.limited" for code, _ in bob.frames.errors)


def test_a_merge_stays_in_the_history_though_unvoted() -> None:
    """Among the answers to one question, unvoted ones go once a sibling is approved; a
    merge of the approved ones starts unvoted, and is what the room asked for: it stays."""
    from collab.chat.services.votes import APPROVED, steer

    question = Message(id=1, seq=1, role="user", text="q")
    a = Message(id=2, seq=2, role="assistant", reply_to_id=1, verdict=APPROVED, votes_up=1, text="a")
    b = Message(id=3, seq=3, role="assistant", reply_to_id=1, verdict=APPROVED, votes_up=2, text="b")
    c = Message(id=4, seq=4, role="assistant", reply_to_id=1, text="c, unvoted")
    merge = Message(id=5, seq=5, role="assistant", reply_to_id=1, merge_of=[2, 3], text="a and b")
    kept = steer(Room(rejected_left_out=True), [question, a, b, c, merge])
    assert [m.id for m in kept] == [1, 2, 3, 5]


def test_an_approved_reply_streaming_again_does_not_hide_its_siblings() -> None:
    """An approved answer being continued (streaming, its text not in history meanwhile)
    or approved with no text stands for nothing: the question keeps its other answers."""
    from collab.chat.services.votes import APPROVED, steer

    question = Message(id=1, seq=1, role="user", text="q")
    again = Message(id=2, seq=2, role="assistant", reply_to_id=1, verdict=APPROVED, votes_up=1, status="streaming")
    empty = Message(id=3, seq=3, role="assistant", reply_to_id=1, verdict=APPROVED, votes_up=1, status="failed")
    other = Message(id=4, seq=4, role="assistant", reply_to_id=1, status="done", text="the other answer")
    kept = steer(Room(rejected_left_out=True), [question, again, empty, other])
    assert 4 in [m.id for m in kept]
    again.status, again.text = "done", "approved and whole"
    assert 4 not in [m.id for m in steer(Room(rejected_left_out=True), [question, again, empty, other])]
