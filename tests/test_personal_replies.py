"""A reply for each person: lenses, `/each`, sharing, and the privacy of personal replies
(docs/architecture.md#a-personal-replies; docs/wire.md, "lens", "/each", "share"),
over real WebSocket clients, the real openai client and the simulated model, on the
in-memory layer and a real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from collab.chat.generation import registry
from collab.chat.models import Membership, Message, Room
from tests.conftest import Member, World, all_final, connected, member, reply_ids, stalling

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("replies_idle")]


def add_member(world: World, name: str, lens: str = "") -> User:
    user = User.objects.create_user(name, password=f"pw-{name}-123")
    Membership.objects.create(room=world.room, user=user, lens=lens)
    return user


aadd_member = database_sync_to_async(add_member)


async def drain(m: Member) -> None:
    """Read whatever was sent to this socket (replies are all stored by now)."""
    while not await m.comm.receive_nothing(timeout=0.2):
        await m.pump()


async def refused(m: Member, **frame: Any) -> str:
    """Send a frame; the code of the error it gets back."""
    n = len(m.frames.errors)
    await m.send(**frame)
    await m.until(lambda f: len(f.errors) > n)
    return m.frames.errors[n][0]


async def settle() -> None:
    """Every reply has ended and been stored."""
    async with asyncio.timeout(30):
        await registry.wait_idle()


def personal(recipient: str | None = None) -> list[Message]:
    qs = Message.objects.filter(role="assistant", recipient__isnull=False).select_related("recipient")
    if recipient is not None:
        qs = qs.filter(recipient__username=recipient)
    return list(qs.order_by("seq"))


apersonal = database_sync_to_async(personal)


def page(user: User, name: str, query: dict[str, str] | None = None, **kwargs: Any) -> tuple[int, str]:
    client = Client()
    client.force_login(user)
    response = client.get(reverse(name, kwargs={"slug": "lab", **kwargs}), query or {})
    return response.status_code, response.content.decode()


apage = sync_to_async(page)


def recorded_with(sim: tuple[str, Any], needle: str) -> list[list[dict[str, Any]]]:
    """The messages of each request the simulated model got whose text holds `needle`."""
    return [r["messages"] for r in list(sim[1].recorded) if needle in str(r["messages"])]


@contextlib.asynccontextmanager
async def tabs(*users: User) -> AsyncIterator[list[Member]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(member(u)) for u in users]


async def set_lens(m: Member, text: str) -> None:
    n = len(m.raw)
    await m.send(action="lens", text=text)
    await m.until(lambda f: any('id="lens"' in r for r in m.raw[n:]))


# --- lenses -------------------------------------------------------------------------------


@pytest.mark.usefixtures("memory_layer")
async def test_lens_is_set_for_every_tab_of_its_member_only(world: World) -> None:
    async with tabs(world.alice, world.alice, world.bob) as (alice1, alice2, bob):
        await alice1.send(action="lens", text="  answer me in Spanish  ")
        for tab in (alice1, alice2):
            await tab.until(lambda f, t=tab: any('id="lens"' in r for r in t.raw))
            frame = next(r for r in tab.raw if 'id="lens"' in r)
            assert 'data-lens="answer me in Spanish"' in frame
            assert 'hx-swap-oob="true"' in frame
        await bob.assert_silent()
        lens = await Membership.objects.filter(room=world.room, user=world.alice).values_list("lens", flat=True).aget()
        assert lens == "answer me in Spanish"
        await alice2.send(action="lens", text="")  # empty clears
        await alice1.until(lambda f: 'data-lens=""' in alice1.raw[-1])
        lens = await Membership.objects.filter(room=world.room, user=world.alice).values_list("lens", flat=True).aget()
        assert lens == ""


@pytest.mark.usefixtures("memory_layer")
@pytest.mark.parametrize(
    ("text", "code"),
    [("x" * 501, "lens.too_long"), (42, "lens.invalid"), (None, "lens.invalid"), ("a\x00b", "lens.invalid")],
)
async def test_a_bad_lens_is_refused_and_changes_nothing(world: World, text: object, code: str) -> None:
    await Membership.objects.filter(room=world.room, user=world.bob).aupdate(lens="keep me")
    async with member(world.bob) as bob:
        await bob.send(action="lens", text=text)
        await bob.until(lambda f: bool(f.errors))
        assert bob.frames.errors[0][0] == code
    lens = await Membership.objects.filter(room=world.room, user=world.bob).values_list("lens", flat=True).aget()
    assert lens == "keep me"


async def test_the_room_page_shows_the_members_own_lens(world: World) -> None:
    await Membership.objects.filter(room=world.room, user=world.bob).aupdate(lens="I am the <designer>")
    status, html = await apage(world.bob, "room")
    assert status == 200
    assert 'id="lens"' in html and 'data-lens="I am the &lt;designer&gt;"' in html
    _, alices = await apage(world.alice, "room")
    assert "designer" not in alices


# --- /each --------------------------------------------------------------------------------


@pytest.mark.usefixtures("layer")
async def test_each_gives_three_members_private_replies_and_a_fourth_sees_none_until_shared(
    world: World, sim: tuple[str, Any]
) -> None:
    tag = uuid.uuid4().hex[:8]
    lenses = {
        "alice": f"Answer me in Spanish ({tag}).",
        "bob": f"I am the designer; focus on the UI ({tag}).",
        "dave": f"I run operations; be terse ({tag}).",
    }
    dave = await aadd_member(world, "dave")
    erin = await aadd_member(world, "erin")  # no lens
    async with tabs(world.alice, world.alice, world.bob, dave, erin) as (alice1, alice2, bob, dave_tab, erin_tab):
        for tab, name in ((alice1, "alice"), (bob, "bob"), (dave_tab, "dave")):
            await set_lens(tab, lenses[name])
        await alice1.post(f"/each how should we ship this? {tag}")
        recipients = {"alice": (alice1, alice2), "bob": (bob,), "dave": (dave_tab,)}
        for _name, mine in recipients.items():
            for tab in mine:
                await tab.until(lambda f: all_final(f, 1))
        await settle()
        stored = {m.recipient.username: m for m in await apersonal()}
        assert set(stored) == {"alice", "bob", "dave"}
        assert all(m.status == "done" and m.text for m in stored.values())
        assert len({m.text for m in stored.values()}) == 3  # three different replies
        for tab in (alice1, alice2, bob, dave_tab, erin_tab):
            await drain(tab)
        for name, mine in recipients.items():
            for tab in mine:
                # exactly their own reply: streamed, ended, marked as theirs
                assert reply_ids(tab.frames) == [stored[name].id]
                reply = tab.frames.replies[stored[name].id]
                assert reply.final_attrs["data-recipient"] == name
                assert reply.text == stored[name].text
                others = [m for n, m in stored.items() if n != name]
                for other in others:
                    assert all(f"msg-{other.id}" not in raw and other.text[:40] not in raw for raw in tab.raw)
        # the fourth member: the question, and no frame of any personal reply
        assert reply_ids(erin_tab.frames) == []
        for m in stored.values():
            assert all(f"msg-{m.id}" not in raw and m.text[:40] not in raw for raw in erin_tab.raw)
        # the asker is told how many replies started and for whom (every tab of theirs), in
        # the thread under the question, nobody else
        question = await Message.objects.aget(room=world.room, role="user", text__contains=tag)
        for tab in (alice1, alice2):
            (told,) = [raw for raw in tab.raw if "each.started" in raw]
            assert f'hx-swap-oob="afterend:#msg-{question.id}"' in told and 'data-count="3"' in told
            assert "for alice, bob, dave" in told and "none is for you" not in told
        assert not any("each.started" in raw for raw in bob.raw + erin_tab.raw)
        # the model was asked once per lens, each request holding that lens alone
        for name, lens in lenses.items():
            asked = recorded_with(sim, lens)
            assert len(asked) == 1, name
            assert asked[0][0]["role"] == "system" and lens in asked[0][0]["content"]
            assert all(other not in str(asked[0]) for n, other in lenses.items() if n != name)

        # alice shares hers: everyone gets exactly that one, in place (its seq), unmarked
        shared = stored["alice"]
        await alice1.send(action="share", message_id=shared.id)
        for tab in (alice1, alice2, bob, dave_tab, erin_tab):
            await tab.until(
                lambda f, t=tab: any(f'id="msg-{shared.id}"' in r and "data-recipient" not in r for r in t.raw[-3:])
            )
        await drain(erin_tab)
        assert reply_ids(erin_tab.frames) == [shared.id]
        assert erin_tab.frames.replies[shared.id].seq == shared.seq
        for m in (stored["bob"], stored["dave"]):
            assert all(f"msg-{m.id}" not in raw for raw in erin_tab.raw)
        assert (await Message.objects.aget(pk=shared.id)).recipient_id is None
        # whose it was, and its lens, stay with it: "for alice · shared", the lens on hover
        shown = next(r for r in reversed(erin_tab.raw) if f'id="msg-{shared.id}"' in r)
        assert "for alice &middot; shared" in shown or "for alice · shared" in shown
        assert f'title="Lens: {lenses["alice"]}"' in shown

    # a (re)connect's snapshot: the shared one, and only one's own personal reply
    async with tabs(erin, world.bob) as (erin_again, bob_again):
        assert f'id="msg-{shared.id}"' in erin_again.raw[0]
        assert f'id="msg-{stored["bob"].id}"' not in erin_again.raw[0]
        assert f'id="msg-{stored["dave"].id}"' not in erin_again.raw[0]
        assert f'id="msg-{stored["bob"].id}"' in bob_again.raw[0] and 'data-recipient="bob"' in bob_again.raw[0]
        assert f'id="msg-{stored["dave"].id}"' not in bob_again.raw[0]


async def test_history_pages_hold_only_shared_messages_and_ones_own(world: World, memory_layer: None) -> None:
    dave = await aadd_member(world, "dave", lens="be terse")
    await Membership.objects.filter(room=world.room, user=world.bob).aupdate(lens="in Spanish")
    async with member(world.alice) as alice:
        await alice.post("/each what now?")
        await alice.until(lambda f: any("each.started" in r for r in alice.raw))
    await settle()
    bobs, daves = (await apersonal("bob"))[0], (await apersonal("dave"))[0]
    for who, mine, theirs in ((world.bob, bobs, daves), (dave, daves, bobs)):
        _, room_page = await apage(who, "room")
        assert f'id="msg-{mine.id}"' in room_page and f'id="msg-{theirs.id}"' not in room_page
        _, older = await apage(who, "room_older", query={"before": str(10**9)})
        assert f'id="msg-{theirs.id}"' not in older
        status, _ = await apage(who, "message_full", message_id=theirs.id)
        assert status == 404
        status, whole = await apage(who, "message_full", message_id=mine.id)
        assert status == 200 and f'data-recipient="{who.username}"' in whole
    _, alices = await apage(world.alice, "room")  # the asker has no lens: neither reply
    assert f'id="msg-{bobs.id}"' not in alices and f'id="msg-{daves.id}"' not in alices


async def test_personal_replies_are_never_in_a_models_history(
    world: World, sim: tuple[str, Any], memory_layer: None
) -> None:
    await Membership.objects.filter(room=world.room, user=world.bob).aupdate(lens="in Spanish")
    async with member(world.alice) as alice:
        await alice.post("/each @a first question")
        await alice.until(lambda f: any("each.started" in r for r in alice.raw))
        await settle()
        (bobs,) = await apersonal("bob")
        tag = uuid.uuid4().hex
        await alice.post(f"@a a shared question {tag}")
        await alice.until(lambda f: all_final(f, 1))
    await settle()
    (asked,) = recorded_with(sim, tag)
    assert "first question" in str(asked)  # the question is shared history
    assert bobs.text[:40] not in str(asked)  # bob's personal reply is not


async def test_each_without_any_lens_is_refused_and_stores_nothing(world: World, memory_layer: None) -> None:
    async with member(world.alice) as alice:
        await alice.post("/each anyone?")
        await alice.until(lambda f: bool(f.errors))
        assert alice.frames.errors[0][0] == "each.no_lens"
    assert await Message.objects.acount() == 0


async def test_each_without_a_mention_uses_the_rooms_default_assistant(world: World, memory_layer: None) -> None:
    await Membership.objects.filter(room=world.room, user=world.bob).aupdate(lens="in Spanish")
    world.assistants["b"].is_default = True
    await database_sync_to_async(world.assistants["b"].save)()
    async with member(world.alice) as alice:
        await alice.post("/each hello")
        await alice.until(lambda f: any("each.started" in r for r in alice.raw))
    await settle()
    (reply,) = await apersonal("bob")
    assert reply.assistant_id == world.assistants["b"].id
    assert reply.made_for == "bob" and reply.lens == "in Spanish"  # its provenance, kept once shared
    # alice has no lens: the notice says so, as a notice (not an error)
    (told,) = [r for r in alice.raw if "each.started" in r]
    assert 'class="notice thread-notice"' in told and "for bob:" in told and "none is for you" in told
    assert 'class="error"' not in told
    assert await Message.objects.filter(role="assistant").acount() == 1


@pytest.mark.usefixtures("memory_layer")
async def test_each_replies_stream_in_parallel_each_to_its_own_member(world: World, sim: tuple[str, Any]) -> None:
    await stalling(world, "a")  # 8 tokens, then silence: all three are streaming at once
    dave = await aadd_member(world, "dave", lens="be terse")
    await Membership.objects.filter(room=world.room, user__in=[world.alice, world.bob]).aupdate(lens="in Spanish")
    async with tabs(world.alice, world.bob, dave) as members:
        await members[0].post("/each @a go")
        for tab in members:
            await tab.until(lambda f: any(r.status == "streaming" and r.text for r in f.replies.values()))
        ids = {tab: reply_ids(tab.frames) for tab in members}
        assert all(len(v) == 1 for v in ids.values()) and len({v[0] for v in ids.values()}) == 3
        running = {reply_id for reply_id in registry.ids()}
        assert {v[0] for v in ids.values()} <= running  # all three at once
        # a personal reply is stopped by its recipient, not by the asker (not theirs to see)
        await members[0].send(action="stop", message_id=ids[members[1]][0])
        await members[0].until(lambda f: bool(f.errors))
        assert members[0].frames.errors[-1][0] == "message.not_found"
        for tab in members:
            await tab.send(action="stop", message_id=ids[tab][0])
        for tab in members:
            await tab.until(lambda f: all_final(f, 1))
    await settle()
    assert {m.status for m in await apersonal()} == {"stopped"}


# --- forged frames ---------------------------------------------------------------------------


@pytest.mark.usefixtures("memory_layer")
async def test_others_personal_replies_are_as_if_they_did_not_exist(world: World) -> None:
    await Membership.objects.filter(room=world.room, user=world.bob).aupdate(lens="in Spanish")
    async with tabs(world.alice, world.bob) as (alice, bob):
        await alice.post("/each @a what?")
        await bob.until(lambda f: all_final(f, 1))
        await settle()
        (bobs,) = await apersonal("bob")
        # alice (the asker, the room's owner) may not share, stop or regenerate bob's reply
        for action in ("share", "stop", "regenerate"):
            assert await refused(alice, action=action, message_id=bobs.id) == "message.not_found", action
        await drain(bob)
        await drain(alice)
        assert all(f"msg-{bobs.id}" not in raw for raw in alice.raw)
        assert bob.frames.errors == []
    reply = await Message.objects.aget(pk=bobs.id)
    assert reply.recipient_id == world.bob.id and reply.status == "done"
    assert await Message.objects.filter(role="assistant").acount() == 1  # no regenerated copy


@pytest.mark.usefixtures("memory_layer")
async def test_share_refuses_a_bad_id_a_shared_reply_and_a_streaming_one(world: World) -> None:
    await stalling(world, "a")
    await Membership.objects.filter(room=world.room, user=world.bob).aupdate(lens="in Spanish")
    async with tabs(world.alice, world.bob) as (alice, bob):
        await alice.post("/each @a what?")
        await bob.until(lambda f: any(r.status == "streaming" and r.text for r in f.replies.values()))
        (rid,) = reply_ids(bob.frames)
        for bad, code in (("x", "message.invalid_id"), (True, "message.invalid_id"), (rid, "share.streaming")):
            assert await refused(bob, action="share", message_id=bad) == code
        await bob.send(action="stop", message_id=rid)
        await bob.until(lambda f: all_final(f, 1))
        # A locked room: sharing publishes, so it waits like a post (nothing changes).
        await Room.objects.filter(pk=world.room.pk).aupdate(status=Room.Status.LOCKED)
        assert await refused(bob, action="share", message_id=rid) == "room.locked"
        assert (await Message.objects.aget(pk=rid)).recipient_id == world.bob.pk
        await Room.objects.filter(pk=world.room.pk).aupdate(status=Room.Status.OPEN)
        await bob.send(action="share", message_id=rid)
        await alice.until(lambda f: rid in f.replies)
        await bob.send(action="share", message_id=rid)
        await bob.until(lambda f: f.errors[-1][0] == "share.not_personal")
    await settle()
    assert (await Message.objects.aget(pk=rid)).recipient_id is None


@pytest.mark.usefixtures("memory_layer")
async def test_a_recipient_regenerates_their_personal_reply_privately(world: World, sim: tuple[str, Any]) -> None:
    tag = uuid.uuid4().hex[:8]
    await Membership.objects.filter(room=world.room, user=world.bob).aupdate(lens=f"in Spanish {tag}")
    async with tabs(world.alice, world.bob) as (alice, bob):
        await alice.post("/each @a what?")
        await bob.until(lambda f: all_final(f, 1))
        await settle()
        (first,) = await apersonal("bob")
        await bob.send(action="regenerate", message_id=first.id)
        await bob.until(lambda f: all_final(f, 2))
        await settle()
        await drain(alice)
    again = [m for m in await apersonal("bob") if m.id != first.id]
    assert len(again) == 1 and again[0].recipient_id == world.bob.id
    assert all(f"msg-{again[0].id}" not in raw for raw in alice.raw)
    assert len(recorded_with(sim, tag)) == 2  # asked again with the lens


@pytest.mark.usefixtures("memory_layer")
async def test_lens_and_share_from_a_read_only_staff_socket_are_refused_and_change_nothing(world: World) -> None:
    await Membership.objects.filter(room=world.room, user=world.bob).aupdate(lens="in Spanish")
    staff = await database_sync_to_async(User.objects.create_user)("staff", password="pw-staff-123", is_staff=True)
    async with tabs(world.alice, world.bob) as (alice, bob):
        await alice.post("/each @a what?")
        await bob.until(lambda f: all_final(f, 1))
        await settle()
        (bobs,) = await apersonal("bob")
        async with connected(staff, "lab") as (ok, _code, viewer):
            assert ok
            await viewer.until(lambda f: f.snapshots == 1)
            assert f"msg-{bobs.id}" not in viewer.raw[0]
            assert await refused(viewer, action="lens", text="mine") == "room.read_only"
            assert await refused(viewer, action="share", message_id=bobs.id) == "room.read_only"
        await drain(alice)
        assert all(f"msg-{bobs.id}" not in raw for raw in alice.raw)
    assert not await Membership.objects.filter(user=staff).aexists()
    assert (await Message.objects.aget(pk=bobs.id)).recipient_id == world.bob.id


@pytest.mark.usefixtures("memory_layer")
async def test_a_lens_frame_sets_only_the_senders_own_lens(world: World) -> None:
    async with tabs(world.alice, world.bob) as (alice, bob):
        await alice.send(action="lens", text="mine", username="bob", user_id=world.bob.id)
        await alice.until(lambda f: any('data-lens="mine"' in r for r in alice.raw))
        await bob.assert_silent()
    lenses = dict(await database_sync_to_async(list)(Membership.objects.values_list("user__username", "lens")))
    assert lenses == {"alice": "mine", "bob": ""}
