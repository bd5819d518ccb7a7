"""`/each QUESTION`: one personal reply per member who has a lens, all in parallel
(docs/architecture.md#a-personal-replies; docs/wire.md, "/each").

Posting (replies/posting.py) asks `plan` whether a message is an `/each` and, if so,
stores the question with `create` instead of the usual placeholders: for every member
with a lens, one placeholder per assistant, with that member as its recipient. The
question is the room's; each reply is its recipient's alone until they share it
(services/lenses.py): its "new", pieces, state and final go to their member group only.

Which assistants: those @mentioned (or @all); when none is, the room's default
assistant: the first (by handle) of its assistants marked "default" (Assistant.is_default,
the ones every new room gets), else its first assistant by handle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.template.loader import get_template

from collab.chat import broadcast, frames
from collab.chat.errors import ClientError
from collab.chat.events import RoomFrame
from collab.chat.models import Assistant, Membership, Message, Room
from collab.chat.replies.jobs import create_placeholders
from collab.chat.services import availability, threads

log = logging.getLogger(__name__)

PREFIX = "/each "
_notice = get_template("chat/_each_notice.html")


@dataclass
class EachPlan:
    assistants: list[Assistant]
    members: list[Membership]  # those with a lens, their user loaded

    @property
    def count(self) -> int:
        return len(self.assistants) * len(self.members)


def is_each(text: str) -> bool:
    return text[: len(PREFIX)].lower() == PREFIX


def default_assistant(room: Room) -> list[Assistant]:
    """The room's default assistant, of those it may use (none: [])."""
    attached = room.assistants.select_related("provider").order_by("-is_default", "handle")
    return availability.available(room, attached)[:1]


def plan(room: Room, text: str, invoked: list[Assistant], mentioned: list[str]) -> EachPlan | None:
    """None for an ordinary message. For `/each`: who answers whom; a ClientError (and,
    raised inside posting's transaction, nothing stored) when nobody would get a reply."""
    if not is_each(text):
        return None
    handles = {a.handle.lower() for a in room.assistants.all()} | {"all"}
    assistants = invoked if any(name in handles for name in mentioned) else default_assistant(room)
    if not assistants:
        raise ClientError("each.no_assistant", "No assistant is in this room to answer /each; nothing was posted.")
    members = list(Membership.objects.filter(room=room).exclude(lens="").select_related("user").order_by("id"))
    if not members:
        raise ClientError(
            "each.no_lens",
            "Nobody in this room has set a lens, so /each has nobody to answer; nothing was posted. "
            "Set yours in the lens box, then ask again.",
        )
    each = EachPlan(assistants, members)
    cap = int(settings.COLLAB.get("MAX_EACH_REPLIES", 24))
    if each.count > cap:
        raise ClientError(
            "each.too_many",
            f"/each would start {each.count} replies here; at most {cap} at once. Name fewer assistants.",
        )
    return each


def readers(each: EachPlan | None) -> int:
    """How many copies of each reply a post makes: one per member with a lens for `/each`."""
    return 1 if each is None else len(each.members)


def create(
    room: Room, question: Message, assistants: list[Assistant], each: EachPlan | None, first_seq: int
) -> list[Message]:
    """The reply placeholders at the seqs after the question: the usual shared ones, or
    for `/each` personal ones, member by member (`assistants`: none when a budget refused)."""
    if each is None:
        return create_placeholders(room, question, assistants, first_seq)
    placeholders: list[Message] = []
    for member in each.members:
        seq = first_seq + len(placeholders)
        placeholders += create_placeholders(room, question, assistants, seq, member.user, member.lens)
    return placeholders


def new_frames(question: Message, placeholders: list[Message], parent: Message | None = None) -> list[RoomFrame]:
    """The "new" frames of a post: the room's (the question, and its shared replies), then
    one per recipient of personal replies (their articles, to their sockets only). In a
    thread (`parent`: the message it hangs on, recounted), into the thread's list, with
    the parent's "N replies" line (services/threads.py)."""
    shared = [p for p in placeholders if p.recipient_id is None]
    html = threads.frame_new([question, *shared], parent)
    out = [frames.new(question.id, html, [p.id for p in shared], thread=question.thread_id)]
    by_recipient: dict[int, list[Message]] = {}
    for p in placeholders:
        if p.recipient_id is not None:
            by_recipient.setdefault(p.recipient_id, []).append(p)
    for user_id, theirs in by_recipient.items():
        ids = [p.id for p in theirs]
        out.append(frames.new(theirs[0].id, threads.frame_new(theirs), ids, to=user_id, thread=question.thread_id))
    return out


def started_text(asker: str, names: list[str], n: int) -> str:
    """What the asker reads under their question: how many replies, for whom, and why none
    is theirs when they have no lens."""
    text = (
        f"/each started {n} personal repl{'y' if n == 1 else 'ies'}, for {', '.join(names)}: "
        "each follows its member's lens and shows only to them until they share it."
    )
    if asker not in names:
        text += " You have no lens here, so none is for you: set yours under “Your lens”."
    return text


async def tell_started(question: Message, placeholders: list[Message]) -> None:
    """The asker (every tab of theirs in the room) is told, in the thread under their
    question, how many replies started and for whom (docs/wire.md, "/each")."""
    personal = [p for p in placeholders if p.recipient_id is not None]
    if not personal or question.author_id is None:
        return
    names = sorted({p.recipient.get_username() for p in personal if p.recipient is not None})
    n = len(personal)
    text = started_text(question.author_name, names, n)
    html = _notice.render({"count": n, "text": text, "question": question.id}).strip()
    try:
        await broadcast.to_room(question.room_id, frames.other(html, to=question.author_id))
    except Exception:  # the layer is away: the replies run and show; only the notice is lost
        log.warning("could not tell the asker of post %s how many replies started", question.id, exc_info=True)
