"""The first token off the storage path (docs/architecture.md#a-early-requests): a post's model requests
are sent before the post is stored, from what this process already knows of the room.

    posting.post_message ─> guess(known, assistants, author, text)   requests sent (llm/early_request.py)
                         ─> store_post (the database thread) ─> remember / posted   what was read and stored
                         ─> adopt(guesses, jobs)   a job whose request is the very one sent takes it;
                                                   every other guess is cancelled (a wasted request)

What this process knows of a room (`Known`): its row, its assistants, and its last
HISTORY_MESSAGES shared messages as a reply's history reads them, kept current by the
posts stored here and the replies that end here (`ended`). It is trusted only while
every room frame this process receives is one it expects (fanout -> `saw`): any other
(another process's post, an edit, a vote, a settings change, a lost frame) forgets it
until the next post that invokes an assistant reads it again. A guess is checked
against the job built from what was stored, so a stale one wastes a request; it never
sends a wrong one.

`store_post` and the sink run in the database thread, `saw` and `guess` on the event
loop: the state is changed under one lock, and a read that began before a frame it
did not expect (`epoch`) is not remembered.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save

from collab.chat import broadcast, metrics
from collab.chat.context import HISTORY_MESSAGES, HistoryRow, build_context, row_of
from collab.chat.generation import ReplyJob
from collab.chat.models import Assistant, Message, Provider, Room
from collab.chat.services import budgets
from collab.chat.services.providers import provider_config
from collab.chat.services.votes import steer
from collab.llm import LLMError
from collab.llm.client import request_body
from collab.llm.early_request import EarlyRequest
from collab.llm.pool import first_url

log = logging.getLogger(__name__)


def enabled() -> bool:
    """COLLAB_EARLY_REQUESTS=0 turns guessing off (a provider that bills a cancelled request)."""
    return os.environ.get("COLLAB_EARLY_REQUESTS", "1") != "0"


@dataclass(frozen=True)
class Known:
    room: Room
    assistants: tuple[Assistant, ...]  # with their providers
    rows: tuple[HistoryRow, ...]  # oldest first; the replies streaming are among them


@dataclass
class Guess:
    assistant_id: int
    body: dict[str, object]
    request: EarlyRequest


Epoch = tuple[int, int]  # (every room's, the room's own): a read that began before either moved is stale

_lock = threading.Lock()
_known: dict[int, Known] = {}
_epochs: dict[int, int] = {}  # per room: bumped by every frame this process did not expect
_every = 0  # bumped by forget_all: a read begun before it is not remembered, in any room
_expected: dict[int, set[tuple[str, int]]] = {}  # per room: the ("new" | "final", message) frames that are ours
_watched: set[int] = set()  # rooms whose frames reach this process (a hub: fanout.py, once it joined)
_distrusted = False  # the channel layer was away (lifecycle.py's `stale`): frames may have been lost


def watch(room_id: int) -> None:
    with _lock:
        _watched.add(room_id)


def unwatch(room_id: int) -> None:
    """Its frames no longer reach this process: what it knows may go stale unseen."""
    with _lock:
        _watched.discard(room_id)
        _forget(room_id)


def forget(room_id: int) -> None:
    with _lock:
        _forget(room_id)


def forget_all() -> None:
    global _every
    with _lock:
        _every += 1
        _known.clear()
        _expected.clear()


def distrust(away: bool) -> None:
    """The channel layer is away (True: frames may be lost unseen, so nothing is known or
    remembered) or back and resynced (False: a read begun while it was away is not
    remembered either)."""
    global _distrusted
    forget_all()
    _distrusted = away


def give_up(jobs: Iterable[ReplyJob]) -> None:
    """The jobs will not start: the requests they took are cancelled, and counted wasted."""
    for job in jobs:
        if job.early is not None and not job.early.taken:
            job.early.cancel()
            metrics.EARLY_REQUESTS.labels("wasted").inc()


def changed(room_id: int | None) -> None:
    """What replies' context is built from changed without a frame (a room's settings, an
    assistant, a provider; None: any room): once it is committed, every process forgets."""
    transaction.on_commit(lambda: _announce(room_id), robust=True)


def _announce(room_id: int | None) -> None:
    if room_id is None:  # this process at once
        forget_all()
    else:
        forget(room_id)
    try:
        async_to_sync(broadcast.to_processes)({"type": "context.changed", "room_id": room_id})
    except Exception:  # the others keep their guesses: each is checked, at worst a wasted request
        log.warning("could not tell the other processes that room %s changed", room_id, exc_info=True)


def _forget(room_id: int) -> None:
    _epochs[room_id] = _epochs.get(room_id, 0) + 1
    _known.pop(room_id, None)
    _expected.pop(room_id, None)


def epoch(room_id: int) -> Epoch:
    return (_every, _epochs.get(room_id, 0))


def saw(room_id: int, frame: Mapping[str, Any]) -> None:
    """A frame of the room's group, as this process receives it."""
    kind = frame["kind"]
    # A piece of a reply, someone typing, a thread's message (services/threads.py): no change to the history.
    if kind == "delta" or "not_user" in frame or "thread" in frame:
        return
    with _lock:
        expected = _expected.get(room_id)
        ours = (kind, frame.get("msg"))
        if expected is not None and ours in expected:
            expected.discard(ours)  # type: ignore[arg-type]
            return
        _forget(room_id)


def known(room_id: int) -> Known | None:
    return _known.get(room_id)


def known_unlimited(room_id: int) -> bool:
    """This process knows the room, and it has no budget (of its own, nor a default)."""
    found = _known.get(room_id)
    return found is not None and budgets.unlimited(found.room)


def remember(
    room: Room,
    assistants: Sequence[Assistant] | None,
    rows: Iterable[HistoryRow],
    since: Epoch,
    expect: Iterable[tuple[str, int]],
) -> None:
    """The room as a post's replies just read it (`since`: the epoch before the read), and
    the frames its post sends. `assistants`: the room's, when the post read them; else
    those already known."""
    with _lock:
        if _distrusted or room.id not in _watched or epoch(room.id) != since:
            return
        if assistants is None:
            before = _known.get(room.id)
            if before is None:
                return
            assistants = before.assistants
        _known[room.id] = Known(room, tuple(assistants), tuple(rows)[-HISTORY_MESSAGES:])
        _expected.setdefault(room.id, set()).update(expect)


def posted(message: Message, since: Epoch) -> None:
    """A post stored here with no reply: one more row of the history."""
    with _lock:
        before = _known.get(message.room_id)
        if before is None or epoch(message.room_id) != since:
            return
        rows = (*before.rows, row_of(message))[-HISTORY_MESSAGES:]
        _known[message.room_id] = Known(before.room, before.assistants, rows)
        _expected.setdefault(message.room_id, set()).add(("new", message.id))


def ended(message: Message) -> None:
    """A reply ended here, as stored (the sink's read-back): its row, and its "final" frame is ours."""
    with _lock:
        before = _known.get(message.room_id)
        if before is None:
            return
        rows = tuple(row_of(message) if row.id == message.id else row for row in before.rows)
        if rows == before.rows:  # not among them (a personal reply, an older one): nothing known changes
            return
        _known[message.room_id] = Known(before.room, before.assistants, rows)
        _expected.setdefault(message.room_id, set()).add(("final", message.id))


def guess(known: Known, assistants: Sequence[Assistant], author_name: str, text: str) -> list[Guess]:
    """Send each assistant's request as it would be if nothing else reached the room
    first. An assistant whose provider has a concurrency cap is not guessed, nor a room
    whose known history holds files (their parts are read from the database: the event
    loop's guess has none of them, and would only waste a request)."""
    if any(row.files for row in known.rows):
        return []
    post = HistoryRow(0, 0, Message.Role.USER, Message.Status.DONE, text, author_name, None, None, "", 0, 0, [])
    history = steer(known.room, [*known.rows[-(HISTORY_MESSAGES - 1) :], post])
    guesses: list[Guess] = []
    try:
        for assistant in assistants:
            config = provider_config(assistant.provider)
            if config.max_concurrency or config.deployment_max_concurrency:
                continue  # a capped provider: a request sent before its slot would exceed the cap
            budget = assistant.provider.context_chars or settings.COLLAB["CONTEXT_CHARS"]
            messages = build_context(assistant, known.room, history, budget)
            body = request_body(assistant.model_name, messages, assistant.temperature, assistant.max_tokens)
            url = first_url(config)
            if url is None:  # the provider changed since it was known: the stored way reads it
                continue
            try:
                request = EarlyRequest(config.endpoint(url), body)
            except LLMError:  # its key is not set: the reply fails as it would have
                continue
            guesses.append(Guess(assistant.id, body, request))
    except BaseException:  # the requests already sent are given up, never left open
        adopt(guesses, [])
        raise
    return guesses


def adopt(guesses: list[Guess], jobs: Sequence[ReplyJob]) -> None:
    """Each job takes the request sent for it if it is the very one it would send;
    the rest are cancelled (no job at all: the post was not stored). A job's request is
    counted once its reply ends (generation.Registry): taken if its stream used it."""
    for job in jobs:
        capped = job.provider.max_concurrency or job.provider.deployment_max_concurrency
        if job.agent is not None or job.recipient_id is not None or capped:
            continue
        body = request_body(job.model, job.messages, job.temperature, job.max_tokens)
        for g in guesses:
            endpoint = g.request.endpoint
            if endpoint.base_url in job.provider.base_urls and g.body == body:
                if endpoint != job.provider.endpoint(endpoint.base_url):  # its timeouts, its key: changed
                    continue
                job.early = g.request
                guesses.remove(g)
                break
    for g in guesses:
        g.request.cancel()
        metrics.EARLY_REQUESTS.labels("wasted").inc()


# --- changes without a frame: Django's signals (connected in apps.py) -------------------------


def _room_saved(sender: type, instance: Room, **kwargs: Any) -> None:
    changed(instance.pk)


def _anything_saved(sender: type, instance: object, **kwargs: Any) -> None:
    changed(None)  # an assistant or a provider: any room's replies may be built from it


def _assistants_changed(sender: type, instance: object, action: str, reverse: bool, **kwargs: Any) -> None:
    if action.startswith("post_"):
        changed(None if reverse else getattr(instance, "pk", None))


def _grants_changed(sender: type, action: str, **kwargs: Any) -> None:
    if action.startswith("post_"):
        changed(None)  # rare, and any room may be concerned: every process forgets


def connect_signals() -> None:
    post_save.connect(_room_saved, sender=Room, dispatch_uid="early.room")
    post_delete.connect(_room_saved, sender=Room, dispatch_uid="early.room_deleted")
    for model in (Assistant, Provider):
        post_save.connect(_anything_saved, sender=model, dispatch_uid=f"early.{model.__name__}")
        post_delete.connect(_anything_saved, sender=model, dispatch_uid=f"early.{model.__name__}_deleted")
    m2m_changed.connect(_assistants_changed, sender=Room.assistants.through, dispatch_uid="early.assistants")
    # Who may use which assistant (services/availability.py): a grant to a room or a group,
    # or a room owner joining or leaving a group, changes which assistants a post may ask.
    for through in (Assistant.granted_rooms.through, Assistant.granted_groups.through, User.groups.through):
        m2m_changed.connect(_grants_changed, sender=through, dispatch_uid=f"early.grants.{through.__name__}")
