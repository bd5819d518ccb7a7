"""Asking a reply's assistant again (regenerate, docs/wire.md "regenerate"): a new reply
to the same question, from the same assistant, the room's history as it is now. A merge
asked again is merged again, from the same answers (merging.redo).

The new reply is a new version of the one asked again (docs/architecture.md#a-versions):
it joins that reply's slot (`version_of` its first version), is shown in its place
from now on, and the slot's other versions are hidden; its article replaces the slot's
on every page (slots.in_place)."""

from __future__ import annotations

from django.db import transaction

from collab.chat import frames, slots
from collab.chat.errors import ClientError
from collab.chat.generation import ReplyJob
from collab.chat.models import Assistant, Message, Room
from collab.chat.replies import merging
from collab.chat.replies.jobs import create_placeholders, reply_jobs, start_and_announce
from collab.chat.services import availability, unread
from collab.chat.services.rooms import allocate_seqs, check_open


def answerable_again(reply: Message) -> tuple[Room, Assistant, Message]:
    """What asking a reply's assistant again needs (a regeneration, a continuation): an
    open room, the assistant still in it and one the room may use, the question still
    there. Its room, assistant and question."""
    room = reply.room
    check_open(room)
    assistant = reply.assistant
    if assistant is None or not room.assistants.filter(pk=assistant.pk).exists():
        raise ClientError("assistant.unavailable", "That assistant is no longer in this room.")
    availability.check(room, [assistant])  # staff may have taken it back since (a continuation makes no placeholder)
    if reply.reply_to is None:
        raise ClientError("message.not_found", "The question this reply answered is gone.")
    if reply.reply_to.deleted_at is not None:  # the model would answer the message before it
        raise ClientError("message.deleted", "The question this reply answered was deleted.")
    return room, assistant, reply.reply_to


def store_regenerate(old: Message) -> tuple[Message, list[ReplyJob]]:
    """The new reply's placeholder and job (database thread); `old`: the reply asked again,
    resolved by the regenerate command."""
    with transaction.atomic():
        if old.status == Message.Status.STREAMING:
            raise ClientError("reply.streaming", "Stop this reply before asking again.")
        room, assistant, question = answerable_again(old)
        seq = allocate_seqs(room.pk, 1, open_only=True)
        placeholders = create_placeholders(room, question, [assistant], seq, old.recipient, old.lens)
        add_version(placeholders[0], old)
        jobs = reply_jobs(room, placeholders, question)
        if old.merge_of:  # a merge asked again: merged again, from the same answers
            merging.redo(placeholders[0], jobs[0], old.merge_of)
        return placeholders[0], jobs


def add_version(new: Message, old: Message) -> None:
    """`new` (a placeholder just made) becomes the shown version of `old`'s slot, its last
    (inside the caller's transaction; the slot's first version locked meanwhile, as the
    show_version command locks it)."""
    root = Message.objects.select_for_update().only("id", "seq", "versions").get(pk=slots.slot_id(old))
    count = root.versions + 1
    slots.slot_of(root.pk).update(versions=count, version_hidden=True)
    new.version_of, new.slot_seq, new.version, new.versions = root, root.seq, count, count
    new.save(update_fields=["version_of", "slot_seq", "version", "versions"])


async def start(reply: Message, jobs: list[ReplyJob]) -> None:
    # It replaces the slot's article where it stands. A personal reply asked again: still
    # its recipient's alone.
    frame = frames.new(reply.id, slots.in_place(reply), [reply.id], to=reply.recipient_id)
    await start_and_announce(jobs, reply.room_id, frame, placeholders=[reply])
    await unread.announce(reply.room_id, [reply])  # a new version: new to the members who see it
