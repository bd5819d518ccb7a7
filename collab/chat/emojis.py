"""The emoji a reaction may be (docs/wire.md, "react"): the Unicode emoji set as the `emoji`
package (PyPI) knows it, never a list of our own.

    canonical(text)   the fully-qualified form of one emoji ("❤" -> "❤️"), or None
    name_of(emoji)    its CLDR name for people ("thumbs up")
    QUICK             the quick set every reaction bar's picker shows first
    catalogue_json()  the picker's list (static/collab/reactions.js), built once per process

A skin-tone variant is accepted (and stored as sent, fully qualified); the picker lists the
base emoji only, which keeps its list at about 1,900 entries (~60 KB, cached by browsers).
"""

from __future__ import annotations

import json
from functools import cache

import emoji as emoji_lib

# Shown first in the picker; each one is checked against the library in tests/test_reactions.py.
QUICK = ("👍", "❤️", "😂", "🎉", "👀", "✅")
MAX_CHARS = 16  # the longest emoji sequence the library knows has 10 code points

_FULLY_QUALIFIED = emoji_lib.STATUS["fully_qualified"]
_COMPONENT = emoji_lib.STATUS["component"]


def canonical(text: object) -> str | None:
    """`text` as one emoji, fully qualified (a minimally qualified or unqualified form, such
    as "❤" without its variation selector, is the same reaction as "❤️"); None when it is
    not exactly one emoji of the library's set, or only a component (a skin tone alone)."""
    if not isinstance(text, str) or not text or len(text) > MAX_CHARS:
        return None
    data = emoji_lib.EMOJI_DATA.get(text)
    if data is None or data["status"] == _COMPONENT:
        return None
    if data["status"] == _FULLY_QUALIFIED:
        return text
    qualified = emoji_lib.emojize(data["en"])
    found = emoji_lib.EMOJI_DATA.get(qualified)
    return qualified if found is not None and found["status"] == _FULLY_QUALIFIED else None


def _words(short_name: str) -> str:
    return short_name.strip(":").replace("_", " ")


def name_of(emoji: str) -> str:
    """Its English name ("thumbs up"); "" for a text the library does not know."""
    data = emoji_lib.EMOJI_DATA.get(emoji)
    return _words(data["en"]) if data is not None else ""


def version() -> str:
    """The library's version: the catalogue's URL carries it (browsers cache that URL)."""
    return str(emoji_lib.__version__)


# The picker's order before any search: faces, then people and gestures, nature, food,
# objects, symbols; flags last. By first code point: the library keeps no CLDR groups.
_BLOCKS = (
    (0x1F600, 0x1F64F),  # emoticons
    (0x1F900, 0x1F9FF),  # supplemental symbols and pictographs
    (0x1F440, 0x1F4FF),  # people, hands, hearts, objects
    (0x1F300, 0x1F43F),  # weather, plants, food, animals
    (0x1F500, 0x1FAFF),  # the rest of the pictographs
    (0x2600, 0x27BF),  # older symbols and dingbats (☀, ✅)
)


def _place(text: str) -> tuple[int, int]:
    first = ord(text[0])
    for rank, (low, high) in enumerate(_BLOCKS):
        if low <= first <= high:
            return rank, first
    return len(_BLOCKS) + (0x1F1E6 <= first <= 0x1F1FF), first  # flags (regional indicators) last


@cache
def catalogue() -> list[list[str]]:
    """[emoji, name, other names] for every fully-qualified emoji without a skin tone, the
    quick set first, then faces, people, nature, ... (`_BLOCKS`), flags last."""
    rows: list[list[str]] = []
    for text, data in sorted(emoji_lib.EMOJI_DATA.items(), key=lambda item: _place(item[0])):
        if data["status"] != _FULLY_QUALIFIED or "skin_tone" in data["en"] or text in QUICK:
            continue
        aliases = " ".join(_words(a) for a in data.get("alias", ()))
        rows.append([text, _words(data["en"]), aliases])
    quick = [[q, name_of(q), " ".join(_words(a) for a in emoji_lib.EMOJI_DATA[q].get("alias", ()))] for q in QUICK]
    return quick + rows


@cache
def catalogue_json() -> bytes:
    """The picker's list as JSON: {"version", "quick", "emoji": [[emoji, name, aliases], ...]}."""
    body = {"version": version(), "quick": list(QUICK), "emoji": catalogue()}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
