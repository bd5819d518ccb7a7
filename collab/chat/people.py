"""People and models as pages show them (docs/wire.md, "Avatars and the assistant's card"):

    avatar(name)            initials on a colour derived from the name: the same on every
                            page, process and day (a CRC of the name, not Python's salted
                            hash), white on a dark hue (AA contrast for every hue:
                            tests/test_people.py)
    assistant_card(m)       who answered a reply: display name, handle, provider, model

Neither reads the database: an article renders with no query of its own (frames render on
the event loop). The card shows what the message carries (its author's name and the model
that answered, `Message.model`) and, when the message was loaded with its assistant and
provider (`select_related("assistant__provider")`, as snapshots, history pages and the
post path do), the handle and the provider's name; never a key or a key's variable.

Uploaded pictures come with files (issue 36): `avatar(name, picture=URL)` then shows the
picture instead of the initials (templates/chat/_avatar.html).
"""

from __future__ import annotations

import re
import zlib

from collab.chat.models import Assistant, Message

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
    """A reply's assistant as its card shows it. The model is the one that answered
    (`Message.model`), else the assistant's configured one."""
    assistant = message.assistant if Message.assistant.is_cached(message) else None
    card = {"name": message.author_name, "handle": "", "provider": "", "model": message.model}
    if assistant is not None:
        card["handle"] = assistant.handle
        if Assistant.provider.is_cached(assistant):
            card["provider"] = assistant.provider.name
            card["model"] = message.model or assistant.model_name
        elif not card["model"]:
            card["model"] = assistant.model
    return card
