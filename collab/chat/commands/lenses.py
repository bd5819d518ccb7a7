"""`lens` and `share` (docs/wire.md; docs/architecture.md#a-personal-replies): a member
sets their personal lens in a room, and shares a personal reply made for them."""

from __future__ import annotations

from django.db import transaction

from collab.chat import broadcast, frames, shared, slots
from collab.chat.commands.registry import REPLY, Access, Ctx, command
from collab.chat.errors import ClientError
from collab.chat.models import Membership, Message
from collab.chat.services import threads
from collab.chat.services.lenses import check_lens, lens_html

STREAMING = ("share.streaming", "This reply is still being written: share it once it has ended.")


def _store_lens(access: Access, text: str) -> None:
    Membership.objects.filter(pk=access.membership.pk).update(lens=text)


@command("lens", params={"text": check_lens})
async def lens(ctx: Ctx, text: str) -> None:
    """Set (or, with empty text, clear) the member's lens here; every tab of theirs in
    this room shows it (their member group), nobody else's."""
    await ctx.store(_store_lens, text)
    await broadcast.to_room(ctx.room_id, frames.other(lens_html(text, True), to=ctx.user_id))


def _shareable(access: Access) -> tuple[Message, list[int]]:
    """The reply the member asks to share, once every check passed (nothing changed yet),
    and the ids of its versions (docs/architecture.md#a-versions): a reply asked again is
    shared whole, every version, none of them streaming."""
    message = access.message
    assert message is not None
    if message.recipient_id is None:
        raise ClientError("share.not_personal", "This reply is already shared with the room.")
    versions = [(message.pk, message.status)]
    if message.versions > 1:
        versions = list(slots.slot_of(slots.slot_id(message)).values_list("pk", "status"))
    if any(status == Message.Status.STREAMING for _, status in versions):
        raise ClientError(*STREAMING)
    return message, [pk for pk, _ in versions]


def _store_share(access: Access, message: Message, ids: list[int]) -> Message:
    """The reply's versions the room's now; the one shown, for its article."""
    user_id = access.membership.user_id
    with transaction.atomic():
        done = Message.objects.filter(pk__in=ids, recipient_id=user_id).exclude(status=Message.Status.STREAMING)
        if done.update(recipient=None) != len(ids):  # shared meanwhile (another tab of theirs)
            raise ClientError("share.not_personal", "This reply is already shared with the room.")
    if message.version_hidden:  # a hidden version shared: the room sees the slot as it is shown
        shown = slots.slot_of(slots.slot_id(message)).filter(version_hidden=False).select_related("reply_to")
        message = shown.first() or message
    message.recipient = None  # made_for and lens stay: the room sees whose it was, and its lens
    if message.thread_id is not None:  # shared in a thread: one more reply there (services/threads.py)
        message.thread = threads.recount(message.thread_id)
    return message


@command("share", message=REPLY, open_room=True)
async def share(ctx: Ctx) -> None:
    """The recipient shares their finished personal reply: from now on it is the room's,
    and every member's page shows it at its seq (collab.js places articles by seq; the
    recipient's own copy is replaced in place). Sharing publishes: not in a locked room.

    A reply whose outcome is stored but whose final article may not have been sent yet
    still holds its live record (replies/sink.py: RoomSink.finish ends it after the
    final): refused as still streaming, so that no late `final` marks it personal again."""
    message, ids = await ctx.store(_shareable)
    if await shared.backend().leased(ids):
        raise ClientError(*STREAMING)
    shown = await ctx.store(_store_share, message, ids)
    parent = shown.thread if shown.thread_id is not None else None
    await broadcast.to_room(ctx.room_id, frames.other(threads.frame_new([shown], parent)))
