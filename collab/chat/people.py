"""People and models as pages show them (docs/wire.md: a message's header, with its avatar
and an assistant's card):

    avatar(name)            initials on a colour derived from the name: the same on every
                            page, process and day (a CRC of the name, not Python's salted
                            hash), white on a dark hue (AA contrast for every hue:
                            tests/test_people.py)
    assistant_card(m)       who answered a reply: display name, handle, provider, model

Neither reads the database: an article renders with no query of its own (frames render on
the event loop). The card shows what the reply's row keeps (its assistant's name, handle
and provider's name as they were when it was made, and the model it was asked of); never
a key or a key's variable.

Uploaded pictures come with files (issue 36): `avatar(name, picture=URL)` then shows the
picture instead of the initials (templates/chat/_avatar.html).
"""

from __future__ import annotations

import re
import zlib

from collab.chat.models import Message

# The avatar's background: hsl(hue SATURATION% LIGHTNESS%) under white initials (collab.css,
# "Avatars"); the darkest hue's contrast is checked in tests/test_people.py.
SATURATION, LIGHTNESS = 50, 30
_PARTS = re.compile(r"[\s._@+-]+")


def hue(name: str) -> int:
    """0-359, from the name alone (case-insensitive)."""
    return zlib.crc32(name.strip().lower().encode()) % 360


def initials(name: str) -> str:
    """One or two letters: the first of the first two words ("Ada Lovelace": "AL",
    "bob_smith": "BS", "alice": "A"); "?" for a name with none."""
    words = [w for w in _PARTS.split(name.strip()) if w]
    return "".join(w[0] for w in words[:2]).upper() or "?"


def avatar(name: str, picture: str = "", bot: bool = False) -> dict[str, object]:
    """What templates/chat/_avatar.html shows for one person or assistant."""
    return {"name": name, "initials": initials(name), "hue": hue(name), "picture": picture, "bot": bot}


def assistant_card(message: Message) -> dict[str, str]:
    """A reply's assistant as its card shows it, from the reply's own row: the names kept
    when it was made (`author_name`, `assistant_handle`, `provider_name`) and the model it
    was asked of (`Message.model`, kept likewise: a later change of the assistant's model
    does not rewrite it)."""
    return {
        "name": message.author_name,
        "handle": message.assistant_handle,
        "provider": message.provider_name,
        "model": message.model,
    }
