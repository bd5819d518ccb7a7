"""Posting a message, the reply pipeline's entry: store it with the room's next seq and
a placeholder for each reply it invokes, then start those replies (jobs.py). The post
command (commands/posting.py) has checked its text, its rate and its member.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from collab.chat import metrics
from collab.chat.context import row_of
from collab.chat.errors import ClientError
from collab.chat.file_models import Attachment
from collab.chat.markup import arender_user_markdown, render_user_markdown
from collab.chat.models import Assistant, Membership, Message, Room
from collab.chat.prepared import Prepared
from collab.chat.replies import agents, each, early
from collab.chat.replies.jobs import ReplyJob, read_history, reply_jobs, start_and_announce
from collab.chat.services import attachments, availability, budgets, rooms, threads, unread

log = logging.getLogger(__name__)

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL (PostgreSQL refuses it) and lone surrogates (not UTF-8)
MENTION_RE = re.compile(r"(?<![\w@])@([A-Za-z0-9][A-Za-z0-9_-]{0,31})")


@dataclass
class PostResult:
    message: Message
    created: bool
    unknown_mentions: list[str] = field(default_factory=list)
    # Mentioned assistants of the room that it may not use (services/availability.py):
    # nothing was asked of them, and the poster is told.
    unavailable: list[str] = field(default_factory=list)
    # Stored, but the replies it asked for were refused (room.budget): the poster is told.
    refused: ClientError | None = None
    # The "new" frame, when it could not be broadcast (the layer was away): the poster's
    # own socket shows it; the others converge when the layer is back.
    unsent_frame: str | None = None
    # A post in a thread: the message it hangs on, its count as this post left it.
    parent: Message | None = None
    # The files it carries (services/attachments.py), in their order: also left on the
    # message (its prefetched `attachments`), so its article renders with no query.
    files: list[Attachment] = field(default_factory=list)


def check_text(text: object, *, empty: bool = False) -> str:
    """A message's text as it is stored (stripped), or the ClientError that says why not.
    `empty`: "" (or no text at all) is allowed, for a post that may carry files alone."""
    if text is None and empty:
        return ""
    if not isinstance(text, str):
        raise ClientError("message.invalid", "A message needs a text field.")
    text = text.strip()
    if not text and not empty:
        raise ClientError("message.empty", "An empty message was not sent.")
    if _UNSTORABLE.search(text):
        raise ClientError("message.invalid_text", "That message holds a NUL or a broken character; nothing was sent.")
    limit = settings.COLLAB["MAX_MESSAGE_CHARS"]
    if len(text) > limit:
        raise ClientError("message.too_long", f"A message is at most {limit:,} characters; this one has {len(text):,}.")
    return text


def check_post_text(text: object) -> str:
    """A post's text: as check_text's, "" allowed (the post command refuses a post with
    neither text nor files: message.empty)."""
    return check_text(text, empty=True)


def check_client_id(client_id: object) -> uuid.UUID | None:
    """The client's id for a post (a retry with the same one is stored once), if any."""
    if client_id in (None, ""):
        return None
    try:
        return uuid.UUID(str(client_id))
    except ValueError:
        raise ClientError("message.invalid_client_id", "client_id must be a UUID.") from None


def check_post(text: object, client_id: object) -> tuple[str, uuid.UUID | None]:
    return check_text(text), check_client_id(client_id)


def mentions(text: str) -> list[str]:
    """Distinct @handles in order of first appearance, lower-cased."""
    seen: dict[str, None] = {}
    for name in MENTION_RE.findall(text):
        seen.setdefault(name.lower(), None)
    return list(seen)


# The post path's reads, their SQL compiled once (prepared.py): the member with
# the user and the room, and the room's assistants with their providers.
def _member(room_id: int, user_id: int) -> QuerySet[Membership]:
    return Membership.objects.select_related("user", "room").filter(room_id=room_id, user_id=user_id)[:1]


def _room_assistants(room_id: int) -> QuerySet[Assistant]:
    return Assistant.objects.filter(rooms__id=room_id).select_related("provider").order_by("handle")


_MEMBER = Prepared(_member, 2)


def _membership(room_id: int, user_id: int) -> Membership:
    found = _MEMBER.rows(room_id, user_id)
    if not found:
        raise ClientError("room.forbidden", "You are not a member of this room.")
    return found[0]


_ASSISTANTS = Prepared(_room_assistants, 1)


@dataclass
class Invoked:
    """What a post asks for: the assistants it invokes, the @names that are no assistant's
    nor member's, those of the room's assistants it named but may not use, and the room's
    assistants it may use (None: not read, the post names nobody and the room does not
    reply to all)."""

    assistants: list[Assistant]
    unknown: list[str]
    unavailable: list[str]
    in_room: list[Assistant] | None


def _invoked(room: Room, text: str) -> Invoked:
    names = mentions(text)
    if not names and not room.reply_to_all:  # most posts: no assistant to read
        return Invoked([], [], [], None)
    attached = _ASSISTANTS.rows(room.id)
    # Only what the room may use is ever invoked (@all and "every message" included): an
    # assistant staff did not grant it is as if not attached, but the poster is told.
    assistants = availability.available(room, attached)
    invoked, unknown = pick(assistants, names, room.reply_to_all)
    withheld = {a.handle.lower() for a in attached} - {a.handle.lower() for a in assistants}
    unavailable = [n for n in unknown if n in withheld]
    unknown = [n for n in unknown if n not in withheld]
    if unknown:  # a member's name is just text
        named = Q()
        for n in unknown:
            named |= Q(user__username__iexact=n)
        found = Membership.objects.filter(named, room=room).values_list("user__username", flat=True)
        members = {u.lower() for u in found}
        unknown = [n for n in unknown if n not in members]
    return Invoked(invoked, unknown, unavailable, assistants)


def pick(assistants: Sequence[Assistant], names: list[str], reply_to_all: bool) -> tuple[list[Assistant], list[str]]:
    """Of the room's assistants, those `names` (mentions) invoke, and the names that are
    none of theirs."""
    by_handle = {a.handle.lower(): a for a in assistants}
    invoked: dict[int, Assistant] = {}
    unknown: list[str] = []
    for name in names:
        if name == "all":
            invoked.update((a.id, a) for a in assistants)
        elif name in by_handle:
            invoked.setdefault(by_handle[name].id, by_handle[name])
        else:
            unknown.append(name)
    if not invoked and reply_to_all:  # mentioning a person never switches the assistants off
        invoked = {a.id: a for a in assistants}
    cap = settings.COLLAB["MAX_CONCURRENT_REPLIES_PER_MESSAGE"]
    return list(invoked.values())[:cap], unknown


def store_post(
    user_id: int,
    room_id: int,
    text: str,
    client_id: uuid.UUID | None,
    html: str | None = None,
    member: Callable[[], Membership] | None = None,
    thread: int | None = None,
    files: Sequence[int] = (),
) -> tuple[PostResult, list[Message], list[ReplyJob]]:
    """Store a post and its replies' placeholders, and build their jobs. `member`: the
    poster's membership as the caller checked it (the post command's Access); without
    it, it is read here (one compiled query). `thread`: the message it replies to in a
    thread (services/threads.py). `files`: upload ids (attachments.check_files), attached
    in the same transaction, or the whole post refused (file.not_found, file.too_large)."""
    since = early.epoch(room_id)  # what this process knows of the room, as of now (replies/early.py)
    try:
        with transaction.atomic():
            membership = member() if member is not None else _membership(room_id, user_id)
            # A repeat of a client_id is not looked for first: the unique constraint turns it
            # into the IntegrityError below (one statement less per post,
            # docs/benchmarks/2026-12-04.md#b-post-statements).
            room = membership.room
            rooms.check_open(room)
            parent = threads.parent_for_post(membership, thread) if thread is not None else None
            claimed = attachments.claim(room_id, user_id, files)  # locked until the commit
            asked = _invoked(room, text)
            assistants, unknown, in_room = asked.assistants, asked.unknown, asked.in_room
            review = agents.review_of(text, assistants)  # `@critic review @planner`: the critic alone
            if review is not None:
                assistants = [review.reviewer]
            if asked.unavailable and not assistants and each.is_each(text):  # refused whole, as /each is
                raise availability.unavailable_error(asked.unavailable[0])
            personal = each.plan(room, text, assistants, mentions(text))  # `/each` (replies/each.py)
            if personal is not None:
                assistants = personal.assistants
            refused = None
            if assistants:  # a spent budget: the message is stored, no reply starts (docs/wire.md)
                try:
                    budgets.check(room)
                except ClientError as exc:
                    assistants, refused = [], exc
            seq = rooms.allocate_seqs(room_id, 1 + len(assistants) * each.readers(personal), open_only=True)
            message = Message.objects.create(
                room=room,
                seq=seq,
                role=Message.Role.USER,
                author=membership.user,
                author_name=membership.user.get_username(),
                client_id=client_id,
                text=text,
                html=render_user_markdown(text) if html is None else html,
                thread=parent,
                files=len(claimed),  # the history's hint: a reply reads files only where this is > 0
            )
            attached = attachments.attach(message, claimed)
            placeholders = each.create(room, message, assistants, personal, seq + 1)
            if parent is not None:  # its "N replies · last HH:MM", in the same transaction
                parent = threads.recount(parent.pk)
    except (IntegrityError, ClientError) as exc:
        # A member's repeat of a stored post (a resend, or the same client_id posted
        # concurrently: the other one won): its insert broke the unique constraint, or the
        # room was locked since. It is acknowledged as stored, never refused.
        forbidden = isinstance(exc, ClientError) and exc.code == "room.forbidden"
        existing = None if forbidden else _repeat_of(user_id, room_id, client_id)
        if existing is None:
            raise
        return PostResult(existing, created=False), [], []
    # The context is read after the commit, not inside the write transaction: the room's
    # write lock is held for the writes alone (docs/benchmarks/2026-12-03.md#b-post-path). Its
    # history ends at this post's seq, so a post stored meanwhile is not in it.
    try:
        jobs = []
        if placeholders:
            rows = read_history(room, message)
            jobs = reply_jobs(room, placeholders, message, rows)
            if review is None and personal is None and parent is None:  # not guessed: a review, `/each`, a thread
                placed = [row_of(p) for p in placeholders]
                ours = [("new", message.id), *(("final", p.id) for p in placeholders)]
                early.remember(room, in_room, [*rows, *placed], since, ours)
        elif parent is None:  # a thread's message is no row of the room's history
            early.posted(message, since)
        if review is not None:
            agents.give_review(jobs, room, review, message)
    except Exception:  # the post is stored: never "try again" (a retry is a repeat, never announced)
        log.exception("post %s stored, but its replies' context could not be read", message.id)
        jobs = []
        _fail(placeholders, "Could not read this conversation for the reply; ask again.")
    result = PostResult(message, True, unknown, refused=refused, parent=parent, files=attached)
    result.unavailable = asked.unavailable
    return result, placeholders, jobs


def _repeat_of(user_id: int, room_id: int, client_id: uuid.UUID | None) -> Message | None:
    if client_id is None:
        return None
    return Message.objects.filter(room_id=room_id, author_id=user_id, client_id=client_id).first()


def _fail(placeholders: list[Message], error: str) -> None:
    """End replies that cannot start, as stored and as announced (their articles show it)."""
    now = timezone.now()
    for reply in placeholders:
        reply.status, reply.error, reply.finished_at = Message.Status.FAILED, error, now
    ids = [r.id for r in placeholders]
    try:
        Message.objects.filter(pk__in=ids, status=Message.Status.STREAMING).update(
            status=Message.Status.FAILED, error=error, finished_at=now
        )
    except Exception:  # the database is away: the sweeper ends them (lifecycle.ORPHAN_GRACE_S)
        log.warning("could not mark replies %s failed", ids, exc_info=True)


def _guess(room_id: int, author_name: str, text: str) -> list[early.Guess]:
    """Send the post's model requests now if this process knows the room well enough to
    guess them (chat/replies/early.py); a post it cannot guess goes the stored way alone, and so
    does one whose guess fails (a guess never fails a post)."""
    known = early.known(room_id)
    if known is None or not early.enabled() or each.is_each(text):
        return []
    room = known.room
    if room.status != Room.Status.OPEN or not budgets.unlimited(room):
        return []  # refused, or its budget read (its own, or the default): the stored way says
    try:
        invoked, _ = pick(known.assistants, mentions(text), room.reply_to_all)
        if not invoked or any(a.is_agent for a in invoked) or agents.review_of(text, list(known.assistants)):
            return []
        return early.guess(known, invoked, author_name, text)
    except Exception:
        log.exception("room %s: a post's requests could not be guessed; it goes the stored way", room_id)
        early.forget(room_id)
        return []


async def post_message(
    user_id: int,
    room_id: int,
    text: str,
    client_id: uuid.UUID | None = None,
    author_name: str = "",
    member: Callable[[], Membership] | None = None,
    thread: int | None = None,
    files: Sequence[int] = (),
) -> PostResult:
    """Post a checked text (check_text, check_client_id): store it, then start the
    replies it asks for. `author_name`: the poster's, from their socket; with it, the
    post's model requests may be sent before it is stored (replies/early.py). `member`:
    as store_post's, run on the database thread before the post is stored. `thread`: the
    message it replies to in a thread (never guessed early: its history is the thread's).
    `files`: checked upload ids, attached as it is stored (never guessed early either: a
    guess knows the text alone)."""
    guesses = _guess(room_id, author_name, text) if author_name and thread is None and not files else []
    try:
        # Markdown and Pygments are CPU work: off the event loop, and off the one database
        # thread that every post and reply end queue on.
        html = await arender_user_markdown(text)
        stored = await database_sync_to_async(store_post)(
            user_id, room_id, text, client_id, html, member, thread, files
        )
    except BaseException:  # not stored (refused, the database away, cancelled): no request goes on
        early.adopt(guesses, [])
        raise
    result, placeholders, jobs = stored
    early.adopt(guesses, jobs)  # a job sent early takes its request; any other guess is cancelled
    if result.created:
        metrics.POSTS.inc()
        try:
            frames = each.new_frames(result.message, placeholders, result.parent)  # the room's, then `/each`'s
        except BaseException:  # no reply starts: the requests its jobs took are given up
            early.give_up(jobs)
            raise
        html = frames[0]["html"]
        try:
            await start_and_announce(jobs, room_id, *frames, placeholders=placeholders)
        except Exception:  # stored, and its replies run: never "try again" (a retry would post it twice)
            log.warning("post %s stored but not announced", result.message.id, exc_info=True)
            result.unsent_frame = html
        await each.tell_started(result.message, placeholders)
        await unread.announce(room_id, [result.message, *placeholders])  # members' sidebars: once per post
    return result
