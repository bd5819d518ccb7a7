"""Where a steered reply ends and how its marker reads (collab/chat/steer.py: the engine's
part of "steer a reply", docs/wire.md), as pure functions; over the wire: tests/test_steer.py."""

from __future__ import annotations

import pytest

from collab.chat.steer import GRACE_CHARS, MARK, Note, Steer, marker


def line(by: str, note: str) -> str:
    return f"{MARK}{by}: {note}"


def cut(pieces: list[str], last: str = "x") -> tuple[str, bool]:
    steer = Steer([Note("m", "p")])
    kept = steer.clip(list(pieces), last)
    return "".join(str(k) for k in kept), steer.cut


@pytest.mark.parametrize(
    ("pieces", "kept", "ended"),
    [
        (["Hello", " world", ".", " Next"], "Hello world.", True),  # a sentence's end, its space in the next piece
        (["Hello", " world.\n\nNext"], "Hello world.", True),  # within one piece
        (["x = 1", "\n", "y"], "x = 1", True),  # a line's end
        (['"Yes!"', " she said"], '"Yes!"', True),  # closing quotes stay with it
        (["pi is 3", ".14", " or so"], "pi is 3.14 or so", False),  # not a sentence's end
        (["word", "s", " go"], "words go", False),  # no boundary yet
    ],
)
def test_the_boundary(pieces: list[str], kept: str, ended: bool) -> None:
    assert cut(pieces) == (kept, ended)


def test_past_the_grace_a_word_ends_it() -> None:
    long = ["a" * (GRACE_CHARS - 2), "bb", "cc dd"]
    assert cut(long) == ("a" * (GRACE_CHARS - 2) + "bbcc", True)


def test_the_marker_is_a_paragraph_of_its_own_outside_code() -> None:
    notes = [Note(line("bob", "one"), "p"), Note(line("carol", "two"), "p")]
    both = line("bob", "one") + "\n\n" + line("carol", "two") + "\n\n"
    assert marker("", notes) == both
    assert marker("Done.", notes) == "\n\n" + both
    assert marker("Done.\n", notes) == "\n" + both
    assert marker("```py\nx = 1", notes) == "\n```\n\n" + both  # a code block is closed first
    assert marker("```py\nx = 1\n```\nDone.", notes) == "\n\n" + both


def test_a_sentence_that_ended_before_the_note_is_not_its_boundary() -> None:
    # "end. Th" came before the note: its sentence's end is behind; the word goes on.
    assert cut(["ree words"], last="end. Th") == ("ree words", False)
    assert cut([" more"], last="end.") == ("", True)  # its space comes now: it ends there
    assert cut(["Next"], last="line\n") == ("", True)  # a line that ended just before: now


def test_no_answer_yet_is_cut_at_once() -> None:
    steer = Steer([Note("m", "p")], now=True)
    assert steer.clip(["Hello", " world."], "") == [] and steer.cut
