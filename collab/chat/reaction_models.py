"""Emoji reactions on messages (docs/wire.md, "react"), and votes on assistant replies.
Part of collab.chat's models (re-exported by models.py).

A Reaction row is one member's one emoji on one message: the record. What pages, frames,
snapshots and exports show is `Message.reactions`, a summary recounted from these rows in
the same transaction as each change (commands/reactions.py), so that rendering a message
never reads them.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Reaction(models.Model):
    message = models.ForeignKey("chat.Message", on_delete=models.CASCADE, related_name="reaction_rows")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reactions")
    # Kept as written, like Message.author_name: the summary and the exports read it after a rename.
    user_name = models.CharField(max_length=150)
    emoji = models.CharField(max_length=32)  # fully qualified (collab/chat/emojis.py)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["message", "user", "emoji"], name="one_reaction_per_member_and_emoji")
        ]

    def __str__(self) -> str:
        return f"{self.user_name} {self.emoji} on {self.message_id}"


class Vote(models.Model):
    """One member's vote on one assistant reply; a new vote replaces it, "none" deletes it."""

    class Value(models.TextChoices):
        UP = "up"
        DOWN = "down"

    message = models.ForeignKey("chat.Message", on_delete=models.CASCADE, related_name="votes")
    voter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="votes")
    # Kept as written, like Message.author_name: the export and the admin read it after a rename.
    voter_name = models.CharField(max_length=150)
    value = models.CharField(max_length=4, choices=Value.choices)
    at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["message", "voter"], name="one_vote_per_member")]

    def __str__(self) -> str:
        return f"{self.voter_name} {self.value} on {self.message_id}"
