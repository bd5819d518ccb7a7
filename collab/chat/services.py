"""The only code that writes rooms, members and messages, and the only code that
broadcasts. Each action validates first (`check_*`, raising ClientError) and broadcasts
only after its transaction has committed.

Sync functions serve the views; `async` ones serve the consumer and run their
database work through `database_sync_to_async`.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.db.models import F, Q, Sum
from django.utils import timezone
from django.utils.text import slugify

from collab.chat import metrics, rendering
from collab.chat.context import build_context
from collab.chat.events import MembershipEnded, RoomFrame, user_group
from collab.chat.generation import Outcome, ReplyJob, broadcast, registry
from collab.chat.markup import render_markdown
from collab.chat.models import Assistant, Membership, Message, Provider, Room
from collab.llm.pool import ProviderConfig

log = logging.getLogger(__name__)

MENTION_RE = re.compile(r"(?<![\w@])@([A-Za-z0-9][A-Za-z0-9_-]{0,31})")
NO_FLOOR = math.inf  # a snapshot message that takes no more pieces (see snapshot())


class ClientError(Exception):
    """An error shown to the one client that caused it, with a dotted code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# --- broadcasting -------------------------------------------------------------------


def broadcast_sync(room_id: int, frame: RoomFrame) -> None:
    async_to_sync(broadcast)(room_id, frame)


def _members_frame(room_id: int) -> RoomFrame:
    return {"type": "room.frame", "kind": "other", "html": rendering.frame_members(members_of(room_id))}


def members_of(room_id: int) -> list[dict[str, object]]:
    return [
        {"username": username, "role": role}
        for username, role in Membership.objects.filter(room_id=room_id)
        .order_by("-role", "user__username")
        .values_list("user__username", "role")
    ]


# --- defaults from the environment --------------------------------------------------


def _split_urls(value: str) -> tuple[str, str]:
    """ "url1,url2,..." -> (first, the rest one per line): an endpoint pool."""
    urls = [u.strip() for u in value.split(",") if u.strip()]
    return (urls[0] if urls else ""), "\n".join(urls[1:])


def default_endpoint_settings() -> dict[str, Any]:
    """The default provider as WIRE.md configures it: COLLAB_LLM_* first, then
    OPENAI_API_KEY alone for the OpenAI API, else the embedded local model."""
    if settings.COLLAB_LLM_BASE_URL:
        base_url, extra = _split_urls(settings.COLLAB_LLM_BASE_URL)
        return {
            "base_url": base_url,
            "extra_base_urls": extra,
            "api_key_env": settings.COLLAB_LLM_API_KEY_ENV if os.environ.get("COLLAB_LLM_API_KEY") else "",
            "default_model": settings.COLLAB_LLM_MODEL or "default",
            "context_chars": 0,
        }
    if os.environ.get("OPENAI_API_KEY"):
        return {
            "base_url": "https://api.openai.com/v1",
            "extra_base_urls": "",
            "api_key_env": "OPENAI_API_KEY",
            "default_model": settings.COLLAB_LLM_MODEL or "gpt-4o-mini",
            "context_chars": 0,
        }
    return {
        "base_url": settings.COLLAB_LOCAL_MODEL_URL,
        "extra_base_urls": "",
        "api_key_env": "",
        "default_model": settings.COLLAB_LLM_MODEL or "smollm2-135m-instruct",
        # SmolLM2 on 2 cores reads ~100-400 prompt tokens/s: ~750 tokens of history
        # keep its first token within seconds (12,000 characters took 22-28 s).
        "context_chars": 3000,
    }


_ENV_NUMBERS = {
    "CONNECT_TIMEOUT": "connect_timeout_s",
    "READ_TIMEOUT": "read_timeout_s",
    "TOTAL_TIMEOUT": "total_timeout_s",
    "MAX_RETRIES": "max_retries",
    "MAX_CONCURRENCY": "max_concurrency",
    "UNHEALTHY_S": "unhealthy_s",
    "PRICE_INPUT": "price_input_per_m",
    "PRICE_OUTPUT": "price_output_per_m",
}


def env_providers() -> dict[str, dict[str, Any]]:
    """Providers named in COLLAB_PROVIDERS, each from COLLAB_PROVIDER_<NAME>_* variables
    (README "Providers from the environment"). Raises ImproperlyConfigured when one is
    incomplete or malformed, naming the variable."""
    out: dict[str, dict[str, Any]] = {}
    for raw in os.environ.get("COLLAB_PROVIDERS", "").split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,63}", name) or name == "default":
            raise ImproperlyConfigured(f"COLLAB_PROVIDERS: {name!r} is not a valid provider name")
        prefix = f"COLLAB_PROVIDER_{name.upper().replace('-', '_')}_"
        base_url, extra = _split_urls(os.environ.get(prefix + "BASE_URL", ""))
        model = os.environ.get(prefix + "MODEL", "")
        if not base_url or not model:
            raise ImproperlyConfigured(f"{prefix}BASE_URL and {prefix}MODEL are required")
        values: dict[str, Any] = {
            "base_url": base_url,
            "extra_base_urls": extra,
            "default_model": model,
            "api_key_env": os.environ.get(prefix + "API_KEY_ENV", f"{name.upper().replace('-', '_')}_API_KEY"),
        }
        for suffix, fieldname in _ENV_NUMBERS.items():
            value = os.environ.get(prefix + suffix)
            if value:
                try:
                    values[fieldname] = Decimal(value) if fieldname.startswith("price") else float(value)
                except (ValueError, ArithmeticError):
                    raise ImproperlyConfigured(f"{prefix}{suffix} must be a number, not {value!r}") from None
        out[name] = values
    return out


def ensure_default_assistant() -> Assistant:
    """Providers follow the environment: "default" (WIRE.md) and those in COLLAB_PROVIDERS,
    each with an assistant of the same handle. Returns the default assistant, which
    new rooms get."""
    provider, _ = Provider.objects.update_or_create(name="default", defaults=default_endpoint_settings())
    for name, values in env_providers().items():
        extra, _ = Provider.objects.update_or_create(name=name, defaults=values)
        Assistant.objects.get_or_create(handle=name, defaults={"display_name": name.title(), "provider": extra})
    assistant = Assistant.objects.filter(is_default=True).select_related("provider").first()
    if assistant is None:
        local = provider.base_url == settings.COLLAB_LOCAL_MODEL_URL
        assistant, _ = Assistant.objects.get_or_create(
            handle="assistant",
            defaults={
                "display_name": "Assistant",
                "provider": provider,
                "is_default": True,
                # a 135M model wanders at 0.7 ("Two + Two equals eight"); 0.2 keeps it on track
                "temperature": 0.2 if local else 0.7,
            },
        )
    return assistant


def provider_config(provider: Provider) -> ProviderConfig:
    return ProviderConfig(
        name=provider.name,
        base_urls=tuple(provider.base_urls),
        api_key_env=provider.api_key_env,
        connect_timeout_s=provider.connect_timeout_s,
        read_timeout_s=provider.read_timeout_s,
        total_timeout_s=provider.total_timeout_s,
        max_retries=provider.max_retries,
        max_concurrency=provider.max_concurrency,
        unhealthy_s=provider.unhealthy_s,
    )


def room_cost(room_id: int) -> Decimal:
    """What the room's replies have cost so far, in US dollars."""
    total = Message.objects.filter(room_id=room_id).aggregate(total=Sum("cost"))["total"]
    return total or Decimal(0)


def user_cost(user_id: int) -> Decimal:
    """What the replies to a person's questions have cost, across rooms."""
    total = Message.objects.filter(reply_to__author_id=user_id).aggregate(total=Sum("cost"))["total"]
    return total or Decimal(0)


def reply_cost(provider: Provider, prompt_tokens: int, completion_tokens: int) -> Decimal:
    return (provider.price_input_per_m * prompt_tokens + provider.price_output_per_m * completion_tokens) / Decimal(
        1_000_000
    )


# --- rooms and members (views) ------------------------------------------------------


def check_room_name(name: str, topic: str) -> tuple[str, str]:
    name, topic = name.strip(), topic.strip()
    if not name:
        raise ClientError("room.name_required", "A room needs a name.")
    if len(name) > 100:
        raise ClientError("room.name_too_long", "A room name is at most 100 characters.")
    if len(topic) > 500:
        raise ClientError("room.topic_too_long", "A topic is at most 500 characters.")
    if not slugify(name):
        raise ClientError("room.name_invalid", "A room name needs at least one letter or digit.")
    return name, topic


def create_room(owner: User, name: str, topic: str = "", reply_to_all: bool = False) -> Room:
    name, topic = check_room_name(name, topic)
    base = slugify(name)[:100]
    default_assistant = ensure_default_assistant()
    for attempt in range(50):
        slug = base if attempt == 0 else f"{base}-{attempt + 1}"
        try:
            with transaction.atomic():
                room = Room.objects.create(name=name, slug=slug, topic=topic, owner=owner, reply_to_all=reply_to_all)
                Membership.objects.create(room=room, user=owner, role=Membership.Role.OWNER)
                room.assistants.add(default_assistant)
                return room
        except IntegrityError:
            continue
    slug = f"{base}-{uuid.uuid4().hex[:8]}"
    with transaction.atomic():
        room = Room.objects.create(name=name, slug=slug, topic=topic, owner=owner, reply_to_all=reply_to_all)
        Membership.objects.create(room=room, user=owner, role=Membership.Role.OWNER)
        room.assistants.add(default_assistant)
    return room


def join_by_invite(user: User, token: str) -> Room:
    room = Room.objects.filter(invite_token=token).first()
    if room is None:
        raise ClientError("invite.invalid", "This invite link is not valid (it may have been reset).")
    _, created = Membership.objects.get_or_create(room=room, user=user)
    if created:
        transaction.on_commit(lambda: broadcast_sync(room.id, _members_frame(room.id)))
    return room


def leave_room(user: User, room: Room) -> None:
    if room.owner_id == user.pk:
        raise ClientError("room.owner_cannot_leave", "The owner cannot leave; delete the room instead.")
    remove_member(room, user, reason="left")


def remove_member(room: Room, user: User, reason: str) -> None:
    deleted, _ = Membership.objects.filter(room=room, user=user).exclude(role=Membership.Role.OWNER).delete()
    if not deleted:
        return

    def announce() -> None:
        ended: MembershipEnded = {"type": "membership.ended", "room_id": room.id, "reason": reason}
        layer = get_channel_layer()
        assert layer is not None
        async_to_sync(layer.group_send)(user_group(user.pk), ended)  # type: ignore[arg-type]
        broadcast_sync(room.id, _members_frame(room.id))

    transaction.on_commit(announce)


def reset_invite(room: Room) -> None:
    from collab.chat.models import new_invite_token

    room.invite_token = new_invite_token()
    room.save(update_fields=["invite_token"])


def update_room(room: Room, *, topic: str, reply_to_all: bool, assistant_ids: list[int]) -> None:
    _, topic = check_room_name(room.name, topic)
    with transaction.atomic():
        room.topic = topic
        room.reply_to_all = reply_to_all
        room.save(update_fields=["topic", "reply_to_all"])
        room.assistants.set(Assistant.objects.filter(pk__in=assistant_ids))


# --- posting ------------------------------------------------------------------------


@dataclass
class PostResult:
    message: Message
    created: bool
    unknown_mentions: list[str] = field(default_factory=list)


class _Buckets:
    """Posting rate per (user, room): a burst, then a steady refill (token bucket)."""

    def __init__(self) -> None:
        self._state: dict[tuple[int, int], tuple[float, float]] = {}

    def take(self, key: tuple[int, int]) -> bool:
        burst = float(settings.COLLAB["POST_BURST"])
        refill = settings.COLLAB["POST_REFILL_S"]
        now = time.monotonic()
        tokens, at = self._state.get(key, (burst, now))
        tokens = min(burst, tokens + (now - at) / refill)
        if tokens < 1:
            self._state[key] = (tokens, now)
            return False
        self._state[key] = (tokens - 1, now)
        return True


post_buckets = _Buckets()


def check_post(text: object, client_id: object) -> tuple[str, uuid.UUID | None]:
    if not isinstance(text, str):
        raise ClientError("message.invalid", "A message needs a text field.")
    text = text.strip()
    if not text:
        raise ClientError("message.empty", "An empty message was not sent.")
    limit = settings.COLLAB["MAX_MESSAGE_CHARS"]
    if len(text) > limit:
        raise ClientError("message.too_long", f"A message is at most {limit:,} characters; this one has {len(text):,}.")
    parsed: uuid.UUID | None = None
    if client_id not in (None, ""):
        try:
            parsed = uuid.UUID(str(client_id))
        except ValueError:
            raise ClientError("message.invalid_client_id", "client_id must be a UUID.") from None
    return text, parsed


def mentions(text: str) -> list[str]:
    """Distinct @handles in order of first appearance, lower-cased."""
    seen: dict[str, None] = {}
    for name in MENTION_RE.findall(text):
        seen.setdefault(name.lower(), None)
    return list(seen)


def _invoked(room: Room, text: str) -> tuple[list[Assistant], list[str]]:
    assistants = list(room.assistants.select_related("provider").order_by("handle"))
    by_handle = {a.handle.lower(): a for a in assistants}
    names = mentions(text)
    invoked: dict[int, Assistant] = {}
    unknown: list[str] = []
    for name in names:
        if name == "all":
            invoked.update((a.id, a) for a in assistants)
        elif name in by_handle:
            invoked.setdefault(by_handle[name].id, by_handle[name])
        else:
            unknown.append(name)
    if unknown:  # a member's name is just text
        named = Q()
        for n in unknown:
            named |= Q(user__username__iexact=n)
        found = Membership.objects.filter(named, room=room).values_list("user__username", flat=True)
        members = {u.lower() for u in found}
        unknown = [n for n in unknown if n not in members]
    if not names and room.reply_to_all:
        invoked = {a.id: a for a in assistants}
    cap = settings.COLLAB["MAX_CONCURRENT_REPLIES_PER_MESSAGE"]
    return list(invoked.values())[:cap], unknown


def _allocate_seqs(room_id: int, count: int) -> int:
    """Reserve `count` consecutive seqs in the room; return the first. Must run inside the
    caller's transaction: the row lock (PostgreSQL) or the write lock (SQLite) taken by
    the UPDATE serialises concurrent posts until commit, so none share or skip a seq."""
    Room.objects.filter(pk=room_id).update(last_seq=F("last_seq") + count)
    last = Room.objects.values_list("last_seq", flat=True).get(pk=room_id)
    return int(last) - count + 1


def _reply_jobs(room: Room, replies: list[Message], answered: Message) -> list[ReplyJob]:
    # Only what the context needs, and no more messages than a budget could hold.
    recent = Message.objects.filter(room=room, seq__lte=answered.seq).order_by("-seq")
    fields = ("seq", "role", "status", "text", "author_name", "assistant_id")
    history = list(recent.only(*fields)[:60])[::-1]
    jobs = []
    for reply in replies:
        assistant = reply.assistant
        assert assistant is not None
        budget = assistant.provider.context_chars or settings.COLLAB["CONTEXT_CHARS"]
        jobs.append(
            ReplyJob(
                message_id=reply.id,
                room_id=room.id,
                provider=provider_config(assistant.provider),
                model=assistant.model_name,
                messages=build_context(assistant, room, history, budget),
                temperature=assistant.temperature,
                max_tokens=assistant.max_tokens,
            )
        )
    return jobs


def _create_replies(room: Room, answered: Message, assistants: list[Assistant], first_seq: int) -> list[Message]:
    return [
        Message.objects.create(
            room=room,
            seq=first_seq + i,
            role=Message.Role.ASSISTANT,
            assistant=a,
            author_name=a.display_name,
            reply_to=answered,
            status=Message.Status.STREAMING,
            model=a.model_name,
        )
        for i, a in enumerate(assistants)
    ]


def store_post(
    user_id: int, room_id: int, text: str, client_id: uuid.UUID | None, html: str | None = None
) -> tuple[PostResult, list[Message], list[ReplyJob]]:
    try:
        with transaction.atomic():
            membership = Membership.objects.select_related("user").filter(room_id=room_id, user_id=user_id).first()
            if membership is None:
                raise ClientError("room.forbidden", "You are not a member of this room.")
            if client_id is not None:
                existing = Message.objects.filter(room_id=room_id, author_id=user_id, client_id=client_id).first()
                if existing is not None:
                    return PostResult(existing, created=False), [], []
            room = Room.objects.get(pk=room_id)
            assistants, unknown = _invoked(room, text)
            seq = _allocate_seqs(room_id, 1 + len(assistants))
            message = Message.objects.create(
                room=room,
                seq=seq,
                role=Message.Role.USER,
                author=membership.user,
                author_name=membership.user.get_username(),
                client_id=client_id,
                text=text,
                html=render_markdown(text) if html is None else html,
            )
            replies = _create_replies(room, message, assistants, seq + 1)
            jobs = _reply_jobs(room, replies, message)
    except IntegrityError:
        # The same client_id posted concurrently: the other one won; this is a repeat.
        existing = Message.objects.filter(room_id=room_id, author_id=user_id, client_id=client_id).first()
        if client_id is None or existing is None:
            raise
        return PostResult(existing, created=False), [], []
    return PostResult(message, created=True, unknown_mentions=unknown), replies, jobs


async def post_message(user_id: int, room_id: int, text: object, client_id: object = None) -> PostResult:
    clean_text, parsed_id = check_post(text, client_id)
    if not post_buckets.take((user_id, room_id)):
        raise ClientError("rate.limited", "You are sending messages too fast; wait a moment.")
    # Markdown and Pygments are CPU work: off the event loop, and off the one database
    # thread that every post and reply end queue on.
    html = await sync_to_async(render_markdown, thread_sensitive=False)(clean_text)
    result, replies, jobs = await database_sync_to_async(store_post)(user_id, room_id, clean_text, parsed_id, html)
    if result.created:
        metrics.POSTS.inc()
        frame: RoomFrame = {
            "type": "room.frame",
            "kind": "new",
            "msg": result.message.id,
            "html": rendering.frame_new([result.message, *replies]),
        }
        await _start_and_announce(jobs, room_id, frame)
    return result


async def _start_and_announce(jobs: list[ReplyJob], room_id: int, frame: RoomFrame) -> None:
    """Start the replies' model requests, then broadcast their articles: the broadcast
    overlaps the model's time to first token, and no piece is sent before it."""
    lives = [registry.start(job, finish_reply) for job in jobs]
    try:
        await broadcast(room_id, frame)
    finally:
        for live in lives:
            live.announced.set()


def _store_outcome(job: ReplyJob, outcome: Outcome, html: str) -> Message:
    message = Message.objects.select_related("assistant__provider").get(pk=job.message_id)
    if outcome.prompt_tokens is None:  # the provider sent no usage: ~4 characters a token
        outcome.prompt_tokens = sum(len(m["content"]) for m in job.messages) // 4
    if message.assistant is not None:
        message.cost = reply_cost(message.assistant.provider, outcome.prompt_tokens, outcome.tokens)
    message.text = outcome.text
    message.html = html
    message.status = outcome.status
    message.error = outcome.error[:500]
    message.finished_at = timezone.now()
    message.ttft_ms = outcome.ttft_ms
    message.tokens = outcome.tokens
    message.prompt_tokens = outcome.prompt_tokens
    message.duration_ms = outcome.duration_ms
    message.tps = outcome.tps
    message.save()
    return message


async def finish_reply(job: ReplyJob, outcome: Outcome) -> None:
    """Store a reply's final text, status and metrics, then send its article whole."""
    html = await sync_to_async(render_markdown, thread_sensitive=False)(outcome.text) if outcome.text else ""
    message = await database_sync_to_async(_store_outcome)(job, outcome, html)
    await broadcast(
        job.room_id,
        {"type": "room.frame", "kind": "final", "msg": message.id, "html": rendering.frame_final(message)},
    )


# --- stop and regenerate --------------------------------------------------------------


def _reply_in_room(user_id: int, room_id: int, message_id: object) -> tuple[Message, Membership]:
    if not isinstance(message_id, int | str) or not str(message_id).isdigit():
        raise ClientError("message.invalid_id", "message_id must be a message number.")
    membership = Membership.objects.filter(room_id=room_id, user_id=user_id).first()
    if membership is None:
        raise ClientError("room.forbidden", "You are not a member of this room.")
    message = (
        Message.objects.select_related("reply_to", "assistant__provider", "room")
        .filter(pk=int(message_id), room_id=room_id, role=Message.Role.ASSISTANT)
        .first()
    )
    if message is None:
        raise ClientError("message.not_found", "There is no such reply in this room.")
    return message, membership


def _check_stop(user_id: int, room_id: int, message_id: object) -> Message:
    message, membership = _reply_in_room(user_id, room_id, message_id)
    asker = message.reply_to.author_id if message.reply_to else None
    if user_id != asker and membership.role != Membership.Role.OWNER:
        raise ClientError("reply.forbidden", "Only the person who asked or the room's owner can stop a reply.")
    if message.status != Message.Status.STREAMING:
        raise ClientError("reply.not_streaming", "This reply has already ended.")
    return message


async def stop_reply(user_id: int, room_id: int, message_id: object) -> None:
    message = await database_sync_to_async(_check_stop)(user_id, room_id, message_id)
    if not registry.stop(message.id):
        raise ClientError("reply.not_streaming", "This reply is not streaming on this server any more.")


def _store_regenerate(user_id: int, room_id: int, message_id: object) -> tuple[Message, list[ReplyJob]]:
    with transaction.atomic():
        old, _ = _reply_in_room(user_id, room_id, message_id)
        if old.status == Message.Status.STREAMING:
            raise ClientError("reply.streaming", "Stop this reply before asking again.")
        room = old.room
        assistant = old.assistant
        if assistant is None or not room.assistants.filter(pk=assistant.pk).exists():
            raise ClientError("assistant.unavailable", "That assistant is no longer in this room.")
        if old.reply_to is None:
            raise ClientError("message.not_found", "The question this reply answered is gone.")
        seq = _allocate_seqs(room_id, 1)
        replies = _create_replies(room, old.reply_to, [assistant], seq)
        return replies[0], _reply_jobs(room, replies, old.reply_to)


async def regenerate_reply(user_id: int, room_id: int, message_id: object) -> None:
    if not post_buckets.take((user_id, room_id)):
        raise ClientError("rate.limited", "You are sending messages too fast; wait a moment.")
    reply, jobs = await database_sync_to_async(_store_regenerate)(user_id, room_id, message_id)
    frame: RoomFrame = {"type": "room.frame", "kind": "new", "msg": reply.id, "html": rendering.frame_new([reply])}
    await _start_and_announce(jobs, room_id, frame)


# --- what a (re)connecting member is shown ----------------------------------------------


def _recent(room_id: int, before_seq: int | None = None) -> tuple[list[Message], bool]:
    limit = settings.COLLAB["HISTORY_MESSAGES"]
    qs = Message.objects.filter(room_id=room_id)
    if before_seq is not None:
        qs = qs.filter(seq__lt=before_seq)
    page = list(qs.order_by("-seq")[: limit + 1])
    return page[:limit][::-1], len(page) > limit


def older_messages(room: Room, before_seq: int) -> tuple[list[Message], bool]:
    return _recent(room.id, before_seq)


ORPHAN_GRACE_S = 30  # beyond the provider's total timeout, so no live owner is overtaken


def _end_orphans(candidates: list[Message]) -> None:
    """Replies left `streaming` by a process that died: fail them once no process could
    still own them (older than their provider's total timeout)."""
    now = timezone.now()
    for message in candidates:
        providers = Provider.objects.filter(assistants__id=message.assistant_id or 0)
        total = next(iter(providers.values_list("total_timeout_s", flat=True)), 300.0)
        if (now - message.created_at).total_seconds() > total + ORPHAN_GRACE_S:
            updated = Message.objects.filter(pk=message.pk, status=Message.Status.STREAMING).update(
                status=Message.Status.FAILED,
                error="interrupted: the server stopped mid-reply",
                finished_at=now,
            )
            if updated:
                message.refresh_from_db()


async def snapshot(room_id: int, room_slug: str) -> tuple[str, str, dict[int, float]]:
    """The frames a member gets on (re)connect, and the `floors` that keep what follows
    gap-free and duplicate-free for that member.

    The caller has already joined the room's group, so every frame sent after that is
    queued for it. For a reply streaming here, the snapshot holds exactly the text
    already sent as pieces (read with no await in between), so queued pieces below that
    offset are dropped and the rest continue it. Every other message in the snapshot
    takes no piece at all (floor = inf) and only a whole `final` article replaces it.
    """
    messages, has_older = await database_sync_to_async(_recent)(room_id)
    orphans = [m for m in messages if m.status == Message.Status.STREAMING and registry.get(m.id) is None]
    if orphans:
        await database_sync_to_async(_end_orphans)(orphans)
    members = await database_sync_to_async(members_of)(room_id)
    live_texts: dict[int, str] = {}
    floors: dict[int, float] = {}
    for m in messages:
        live = registry.get(m.id) if m.status == Message.Status.STREAMING else None
        if live is not None:
            text = live.flushed_text()
            live_texts[m.id] = text
            floors[m.id] = len(text)
        else:
            floors[m.id] = NO_FLOOR
    queued = frozenset(m.id for m in messages if (lr := registry.get(m.id)) is not None and lr.queued)
    html = rendering.frame_snapshot(messages, live_texts, has_older=has_older, room_slug=room_slug, queued=queued)
    return html, rendering.frame_members(members), floors


def room_for_socket(user: Any, slug: str) -> tuple[int, str] | None:
    """(room id, slug) when `user` may connect to the room's socket, else None."""
    if not getattr(user, "is_authenticated", False):
        return None
    row = Membership.objects.filter(room__slug=slug, user_id=user.pk).values_list("room_id", "room__slug").first()
    return row
