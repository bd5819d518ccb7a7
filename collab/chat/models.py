"""Rooms, their members and messages. The app's other models (assistants, providers, tools,
MCP servers, files, reactions and votes) live in the *_models.py beside it and are
re-exported here."""

from __future__ import annotations

import secrets
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.urls import reverse

from collab.chat.assistant_models import Assistant
from collab.chat.file_models import Attachment, AttachmentPart  # noqa: F401 (re-exported: part of this app's models)
from collab.chat.mcp_models import McpCall, McpServer, McpTool  # noqa: F401 (re-exported: part of this app's models)
from collab.chat.provider_models import (  # noqa: F401 (re-exported: part of this app's models)
    HANDLE_RE,
    Provider,
    Tool,
    check_object_schema,
    env_name_validator,
    handle_validator,
    key_variable_error,
    object_schema,
    tool_name_validator,
)
from collab.chat.reaction_models import Reaction, Vote  # noqa: F401 (re-exported: part of this app's models)


def new_invite_token() -> str:
    return secrets.token_urlsafe(24)


class Room(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        LOCKED = "locked", "locked (members read, nobody posts)"
        ARCHIVED = "archived", "archived (read-only, hidden from members' lists)"

    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=120, unique=True)
    topic = models.CharField(max_length=500, blank=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="owned_rooms")
    created_at = models.DateTimeField(auto_now_add=True)
    invite_token = models.CharField(max_length=64, unique=True, default=new_invite_token)
    reply_to_all = models.BooleanField(
        "reply to every message",
        default=False,
        help_text="Messages without a mention invoke every assistant.",
    )
    assistants = models.ManyToManyField(Assistant, blank=True, related_name="rooms")
    # Changed by staff and moderators through actions.moderation (audited), never by the room's form.
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    # The seq of the newest message; bumped in the same transaction as each insert.
    last_seq = models.PositiveBigIntegerField(default=0)
    system_prompt = models.TextField(
        "room system prompt",
        blank=True,
        max_length=4000,
        help_text="Added to every assistant's own prompt in this room, from the next reply on.",
    )
    # A monthly budget (calendar month, UTC); blank: none. Owners see it; staff set it.
    budget_tokens = models.PositiveBigIntegerField(
        "monthly token budget", null=True, blank=True, help_text="Tokens (prompt and reply) a month; blank: no limit."
    )
    budget_cost = models.DecimalField(
        "monthly cost budget",
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="US dollars a month; blank: no limit.",
    )

    class Voters(models.TextChoices):
        MEMBERS = "members", "every member"
        MODERATORS = "moderators", "moderators and the owner only"

    class Approval(models.TextChoices):
        VOTERS = "voters", "a majority of those who voted (more up than down, at least one up)"
        ONLINE = "online", "a majority of the members online when the vote is counted"

    # Votes on assistants' replies (docs/wire.md, "vote"): who may vote, what approves.
    voters = models.CharField("who may vote", max_length=12, choices=Voters.choices, default=Voters.MEMBERS)
    approval = models.CharField("approval rule", max_length=12, choices=Approval.choices, default=Approval.VOTERS)
    rejected_left_out = models.BooleanField(
        "leave rejected replies out of history",
        default=True,
        help_text="Assistants do not see replies the room voted down.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        # last_seq belongs to _allocate_seqs alone: saving a Room loaded earlier (an admin
        # form, a view) must not rewind it, or the next post would reuse a seq.
        if self.pk is not None and kwargs.get("update_fields") is None and not kwargs.get("force_insert"):
            kwargs["update_fields"] = [
                f.name for f in self._meta.concrete_fields if not f.primary_key and f.name != "last_seq"
            ]
        super().save(*args, **kwargs)

    def get_absolute_url(self) -> str:
        """The room's page: the admin's "View on site" (staff who are not members see it read-only)."""
        return reverse("room", args=[self.slug])


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner"
        MODERATOR = "moderator"
        MEMBER = "member"

    room = models.ForeignKey(Room, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    joined_at = models.DateTimeField(auto_now_add=True)
    # The member's personal lens in this room ("answer me in Spanish"): `/each` replies use it.
    lens = models.CharField(max_length=500, blank=True)

    class Notify(models.TextChoices):
        ALL = "all", "every message"
        MENTIONS = "mentions", "mentions and replies to me"
        NONE = "none", "never (unread still counted)"

    # Unread (services/unread.py): the member has read this room up to this seq (monotonic).
    read_seq = models.PositiveBigIntegerField(default=0)
    # When the page may notify this member (static/collab/notify.js; commands/unread.py).
    notify = models.CharField(max_length=10, choices=Notify.choices, default=Notify.MENTIONS)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["room", "user"], name="one_membership_per_user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.room}"

    @property
    def moderates(self) -> bool:
        """Owners and moderators: stop any reply, remove and ban members, lock the room."""
        return self.role in (self.Role.OWNER, self.Role.MODERATOR)


class Ban(models.Model):
    """A user barred from a room: no membership, no rejoining by invite link, until unbanned."""

    room = models.ForeignKey(Room, on_delete=models.CASCADE, related_name="bans")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="bans")
    by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="bans_given"
    )
    reason = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["room", "user"], name="one_ban_per_user")]

    def __str__(self) -> str:
        return f"{self.user} banned from {self.room}"


class AuditEntry(models.Model):
    """One staff or moderator action: who, what, on which room or user, when, from where.
    Written by actions.moderation in the action's own transaction; read-only everywhere."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_entries"
    )
    # Names as they were, so the log reads the same after a rename or deletion.
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=40, db_index=True)
    room = models.ForeignKey(Room, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_entries")
    room_name = models.CharField(max_length=120, blank=True)
    target = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_targets"
    )
    target_name = models.CharField(max_length=200, blank=True)
    detail = models.CharField(max_length=500, blank=True)
    address = models.GenericIPAddressField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit log"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.room_name or self.target_name}"


class MessageQuerySet(models.QuerySet["Message"]):
    def visible_to(self, user_id: int | None) -> MessageQuerySet:
        """What one member may see: shared messages, and the personal replies made for them.
        Every read of a room's messages for a person goes through here (page, snapshot,
        search, export, history)."""
        return self.filter(models.Q(recipient__isnull=True) | models.Q(recipient_id=user_id))

    def shared(self) -> MessageQuerySet:
        """Messages everyone in the room sees (what assistants are sent as room history)."""
        return self.filter(recipient__isnull=True)


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    class Status(models.TextChoices):
        STREAMING = "streaming"
        DONE = "done"
        STOPPED = "stopped"
        FAILED = "failed"
        # Its server process stopped or died mid-reply; the text streamed until then is kept.
        INTERRUPTED = "interrupted"

    room = models.ForeignKey(Room, on_delete=models.CASCADE, related_name="messages")
    seq = models.PositiveBigIntegerField()
    role = models.CharField(max_length=10, choices=Role.choices)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="messages"
    )
    assistant = models.ForeignKey(Assistant, null=True, blank=True, on_delete=models.SET_NULL)
    # Kept as written at the time, so history reads the same after a rename or deletion.
    author_name = models.CharField(max_length=150)
    reply_to = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replies")
    client_id = models.UUIDField(null=True, blank=True)
    text = models.TextField(blank=True)
    html = models.TextField(blank=True, help_text="Sanitised rendering of the final text.")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.DONE)
    error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # When it last began streaming, if not at creation (a continuation): the orphan sweep's grace counts from here.
    restarted_at = models.DateTimeField(null=True, blank=True)
    # Reply metrics
    model = models.CharField(max_length=200, blank=True)
    # A reply's assistant's handle and provider as they were when it was made, like author_name:
    # the card behind its name (chat/people.py) shows them without reading the assistant.
    assistant_handle = models.CharField(max_length=32, blank=True)
    provider_name = models.CharField(max_length=64, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True)
    tokens = models.PositiveIntegerField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    tps = models.FloatField(null=True, blank=True)
    cost = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True, help_text="US dollars")
    # A personal reply (`/each`): only this member sees it until they share it (then null).
    recipient = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="personal_replies"
    )
    # A reasoning model's thinking, streamed and stored apart from the answer; never sent back as history.
    reasoning = models.TextField(blank=True)
    # An agent's run log rendered once at its end (full Markdown, its lines kept); "" otherwise.
    reasoning_html = models.TextField(blank=True)
    # The model's finish_reason when it is not plain "stop" (for example "length": cut off at the token limit).
    finish_reason = models.CharField(max_length=20, blank=True)
    # An agent's run (chat/agent.py): its model calls so far; its log is `reasoning`. None: a plain reply.
    agent_steps = models.PositiveSmallIntegerField(null=True, blank=True)
    edited_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)  # a tombstone: text and html emptied
    # Votes on an assistant's reply, counted from Vote rows in the same transaction as each vote.
    votes_up = models.PositiveIntegerField(default=0)
    votes_down = models.PositiveIntegerField(default=0)
    # What the votes decided when last counted (services/votes.py: "approved", "rejected" or ""),
    # and who voted what, when (kept with the counts, so pages render them without a query).
    verdict = models.CharField(max_length=8, blank=True)
    votes_by = models.JSONField(default=list, blank=True)
    # A merge (docs/wire.md, "merge"): the ids of the approved replies it combines, in order,
    # and their seqs: the numbers the page, the exports and the merge's own citations show.
    merge_of = models.JSONField(default=list, blank=True)
    merge_seqs = models.JSONField(default=list, blank=True)
    # A personal reply (/each): whom it was made for, and the lens it followed; both kept
    # once it is shared, so the room sees "for bob · shared" (docs/wire.md, "share").
    made_for = models.CharField(max_length=150, blank=True)
    lens = models.CharField(max_length=500, blank=True)
    # On the room's pinned list (commands/pins.py): since when, and who pinned it (the name
    # kept as written, like author_name). None: not pinned.
    pinned_at = models.DateTimeField(null=True, blank=True)
    pinned_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    pinned_by_name = models.CharField(max_length=150, blank=True)
    # Emoji reactions (commands/reactions.py): [{"emoji": "👍", "by": ["alice", ...]}, ...], in the
    # order each emoji was first given, recounted from Reaction rows with each change.
    reactions = models.JSONField(default=list, blank=True)
    # Versions of one reply (docs/wire.md, "regenerate a reply"): a later version points
    # to its slot's first reply and keeps the slot's place (`slot_seq`: that reply's seq). Each
    # holds its number, the slot's count and whether it is hidden: one version of a slot is shown.
    version_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    slot_seq = models.PositiveBigIntegerField(null=True, blank=True)
    version = models.PositiveSmallIntegerField(default=1)
    versions = models.PositiveSmallIntegerField(default=1)
    version_hidden = models.BooleanField(default=False)
    # Threads (docs/wire.md, "threads"; services/threads.py): a message of a thread points to
    # the top-level message it hangs on, and stays out of the room's timeline. The parent
    # keeps its thread's count and last message's time, bumped in the post's transaction.
    # SET_NULL: a parent deleted as a row (the admin's delete; members leave a tombstone) puts
    # its thread's messages in the room rather than losing them.
    thread = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    thread_replies = models.PositiveIntegerField(default=0)
    thread_last_at = models.DateTimeField(null=True, blank=True)
    # How many files it was posted with (file_models.Attachment), set with the post: a
    # reply's context reads attachments only for the messages of its history that have
    # some, so a room's posts without files cost no query for them (chat/files/for_models.py).
    files = models.PositiveSmallIntegerField(default=0)

    objects = MessageQuerySet.as_manager()

    class Meta:
        ordering = ["seq"]
        constraints = [
            models.UniqueConstraint(fields=["room", "seq"], name="one_seq_per_room"),
            models.UniqueConstraint(
                fields=["room", "author", "client_id"],
                condition=models.Q(client_id__isnull=False),
                name="one_post_per_client_id",
            ),
        ]
        indexes = [
            models.Index(fields=["status"], name="message_status"),
            models.Index(
                fields=["room", "pinned_at"], name="message_pinned", condition=models.Q(pinned_at__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.room.slug}#{self.seq} {self.author_name}"

    @property
    def merge_sources(self) -> list[tuple[int, int]]:
        """A merge's sources as (id, seq) pairs; a merge stored before seqs were kept
        shows its ids."""
        seqs = self.merge_seqs if len(self.merge_seqs) == len(self.merge_of) else self.merge_of
        return list(zip(self.merge_of, seqs, strict=True))


def room_order(message: Any) -> tuple[int, int]:
    """Where a message shows in its room (a Message, or a history row with `seq` and
    `slot_seq`): a later version of a reply at its slot's place, then by seq."""
    return (message.slot_seq or message.seq, message.seq)


class RoomDefaults(models.Model):
    """What every room without a setting of its own gets, set by staff in the admin: one row
    (pk 1). A monthly budget here overrides COLLAB_DEFAULT_ROOM_BUDGET_* (services/budgets.py)."""

    budget_tokens = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Tokens a month (prompt and reply) for each room without a budget of its own."
    )
    budget_cost = models.DecimalField(
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal(0))],
        help_text="US dollars a month for each room without a budget of its own.",
    )

    class Meta:
        verbose_name = verbose_name_plural = "room defaults"

    def __str__(self) -> str:
        return "Room defaults"
