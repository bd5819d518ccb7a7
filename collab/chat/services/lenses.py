"""Personal lenses (docs/architecture.md#a-personal-replies): checked, shown, and told
to the model of a personal reply. Setting one and sharing a personal reply are the
`lens` and `share` commands (commands/lenses.py).

A member's lens ("answer me in Spanish") is theirs in one room (Membership.lens). `/each`
(replies/each.py) makes one reply per member who has one; each is stored with its
recipient and stays theirs alone (frames, snapshot, pages, history sent to models) until
they share it: then it is an ordinary message of the room, shown to everyone at its seq.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from django.template.loader import get_template

from collab.chat.errors import ClientError
from collab.chat.models import Membership, Message, Room

MAX_LENS_CHARS = 500  # Membership.lens's max_length
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # as replies/posting.py: PostgreSQL refuses NUL
_lens = get_template("chat/_lens.html")


# --- the lens -------------------------------------------------------------------------------


def check_lens(text: object) -> str:
    if not isinstance(text, str):
        raise ClientError("lens.invalid", "A lens needs a text field (empty text clears it).")
    text = text.strip()
    if _UNSTORABLE.search(text):
        raise ClientError("lens.invalid", "That lens holds a NUL or a broken character; it was not set.")
    if len(text) > MAX_LENS_CHARS:
        raise ClientError(
            "lens.too_long", f"A lens is at most {MAX_LENS_CHARS} characters; this one has {len(text):,}."
        )
    return text


def lens_html(lens: str, oob: bool = False) -> str:
    """The member's lens box (room page, beside the composer); `oob`: as a frame."""
    return _lens.render({"lens": lens, "oob": oob, "max": MAX_LENS_CHARS}).strip()


def lens_prompt(username: str, lens: str) -> str:
    """What a personal reply's model is told about its one reader (context.build_context)."""
    return (
        f"This reply is for {username} alone: only they will read it. "
        f"Their personal lens, which your answer must follow: {lens}"
    )


def personal_lenses(room: Room, replies: Iterable[Message]) -> dict[int | None, str]:
    """The lens prompt of each personal reply's recipient, by user id (replies/jobs.py)."""
    ids = {r.recipient_id for r in replies if r.recipient_id is not None}
    if not ids:
        return {}
    rows = Membership.objects.filter(room=room, user_id__in=ids).values_list("user_id", "user__username", "lens")
    return {uid: lens_prompt(name, lens) for uid, name, lens in rows if lens}
