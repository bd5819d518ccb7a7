"""Deterministic, model-looking reply text for the simulated model.

Everything here is pure: the same ``(messages, seed, model, n)`` always gives
the same tokens, on any machine and Python run (the RNG seed comes from
SHA-256, never from Python's salted ``hash()``).

A "token" is a piece of text the way a real tokenizer cuts it: words carry
their leading space (``" model"``), punctuation is its own piece, paragraph
breaks are a ``"\\n\\n"`` piece. The reply mixes paragraphs, the odd heading,
Markdown lists, inline ``code``/**bold** and fenced ``python`` blocks, so a
Markdown renderer downstream has real work to do.

The server streams ``simulated_tokens(messages, seed, model, reply_tokens)``
and, when the request's ``max_tokens`` is smaller, only its first
``max_tokens`` pieces (finish_reason ``"length"``). ``expected_text`` gives
that exact text without a server.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from collab.simulator.vocabulary import CODE_TEMPLATES, FUNCS, INLINE_CODE, NAMES, STARTERS, WORDS

__all__ = [
    "base_model",
    "count_prompt_tokens",
    "expected_text",
    "expected_tokens",
    "iter_tokens",
    "simulated_tokens",
    "text_seed",
    "thinking_tokens",
]

# How source text is cut into pieces: words/numbers keep one leading space,
# runs of spaces (indentation) are one piece, newlines are their own pieces.
_PIECE_RE = re.compile(r" ?[A-Za-z_]+| ?\d+| ?[^\sA-Za-z_\d]+|\n| +")


def text_seed(messages: Any, seed: int = 0, model: str = "sim") -> int:
    """Return the RNG seed for a request: SHA-256 of seed, base model and messages.

    ``model`` may carry a fault suffix (``"sim+drop@5"``); only the part before
    the first ``+`` counts, so a faulty variant streams a prefix of the same
    text the plain model would.
    """
    payload = json.dumps(
        {"seed": seed, "model": base_model(model), "messages": messages},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )
    digest = hashlib.sha256(payload.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def base_model(model: str) -> str:
    """The model name without its ``+fault`` suffixes."""
    return model.split("+", 1)[0]


def _cut(source: str) -> list[str]:
    return _PIECE_RE.findall(source)


def _word(rng: random.Random) -> str:
    return " " + rng.choice(WORDS)


def _sentence(rng: random.Random, n: int, *, fancy: bool = True) -> list[str]:
    """A sentence of exactly ``n`` pieces (``n >= 1``), first one unspaced."""
    if n == 1:
        return [rng.choice(STARTERS)]
    out = [rng.choice(STARTERS)]
    body = n - 2  # pieces between the starter and the final punctuation
    while body > 0:
        r = rng.random()
        if fancy and body >= 3 and r < 0.06:
            out += [" `", rng.choice(INLINE_CODE), "`"]
            body -= 3
        elif fancy and body >= 3 and r < 0.10:
            out += [" **", rng.choice(WORDS), "**"]
            body -= 3
        elif body >= 2 and r < 0.16 and len(out) > 2:
            out += [",", _word(rng)]
            body -= 2
        else:
            out.append(_word(rng))
            body -= 1
    out.append(rng.choice((".", ".", ".", ".", ".", "!", "?", ":")) if n > 2 else ".")
    if out[-1] == ":":
        out[-1] = "."
    return out


def _paragraph(rng: random.Random) -> list[str]:
    out: list[str] = []
    for i in range(rng.randint(1, 4)):
        sentence = _sentence(rng, rng.randint(6, 18))
        if i:
            sentence[0] = " " + sentence[0]
        out += sentence
    return out


def _heading(rng: random.Random) -> list[str]:
    words = [rng.choice(WORDS).capitalize() for _ in range(rng.randint(1, 4))]
    return [rng.choice(("##", "###"))] + [" " + w for w in words]


def _bullet_list(rng: random.Random) -> list[str]:
    numbered = rng.random() < 0.35
    out: list[str] = []
    for i in range(rng.randint(2, 5)):
        if i:
            out.append("\n")
        out += [f"{i + 1}", "."] if numbered else ["-"]
        item = _sentence(rng, rng.randint(3, 10), fancy=True)
        item[0] = " " + item[0]
        out += item
    return out


def _code_block(rng: random.Random) -> list[str]:
    template = rng.choice(CODE_TEMPLATES)
    a, b, c = rng.sample(NAMES, 3)
    f = rng.choice(FUNCS)
    names = {"a": a, "b": b, "c": c, "f": f, "F": f.title().replace("_", "")}
    source = "\n".join(line.format(**names) for line in template)
    return ["```", "python", "\n", *_cut(source), "\n", "```"]


def _blocks(rng: random.Random) -> list[str]:
    r = rng.random()
    if r < 0.55:
        return _paragraph(rng)
    if r < 0.75:
        return _bullet_list(rng)
    if r < 0.90:
        return _code_block(rng)
    return [*_heading(rng), "\n\n", *_paragraph(rng)]


def _generate(rng: random.Random, n: int) -> Iterator[str]:
    """Yield exactly ``n`` pieces, a block at a time (lazily: long replies cost nothing upfront)."""
    if n <= 0:
        return
    if n < 12:
        yield from _sentence(rng, n, fancy=False)
        return
    first = _paragraph(rng)
    if len(first) + 4 > n:
        yield from _sentence(rng, n)
        return
    yield from first
    used = len(first)
    # Leave room for "\n\n" plus a closing sentence of at least 3 pieces.
    while True:
        block = _blocks(rng)
        if used + 1 + len(block) + 4 > n:
            break
        yield "\n\n"
        yield from block
        used += 1 + len(block)
    yield "\n\n"
    yield from _sentence(rng, n - used - 1)  # n - used >= 4


def iter_tokens(
    messages: Sequence[Mapping[str, Any]] | Any, seed: int = 0, model: str = "sim", n: int = 120
) -> Iterator[str]:
    """:func:`simulated_tokens`, generated lazily (what the server streams from)."""
    return _generate(random.Random(text_seed(messages, seed, model)), n)


def simulated_tokens(
    messages: Sequence[Mapping[str, Any]] | Any, seed: int = 0, model: str = "sim", n: int = 120
) -> list[str]:
    """The complete ``n``-piece reply the simulated model gives to ``messages``.

    Deterministic for the same ``(messages, seed, base model, n)``. The text is
    built to end cleanly at exactly ``n`` pieces, so a different ``n`` gives a
    different ending; a request with ``max_tokens < n`` streams a prefix of
    this list (see :func:`expected_tokens`).
    """
    tokens = list(iter_tokens(messages, seed, model, n))
    assert len(tokens) == max(n, 0) and all(tokens), (n, tokens)
    return tokens


def thinking_tokens(
    messages: Sequence[Mapping[str, Any]] | Any, seed: int = 0, model: str = "sim", n: int = 0
) -> list[str]:
    """The ``n`` reasoning tokens a ``think@N``/``reasoning@N`` model streams before its
    answer (its answer stays the plain model's); a text of its own, seeded apart."""
    if n <= 0:
        return []
    return simulated_tokens(messages, seed, base_model(model) + "-thinking", n)


def expected_tokens(
    messages: Sequence[Mapping[str, Any]] | Any,
    seed: int = 0,
    model: str = "sim",
    reply_tokens: int = 120,
    max_tokens: int | None = None,
) -> list[str]:
    """The pieces a simulator started with ``seed``/``reply_tokens`` streams for this request."""
    tokens = simulated_tokens(messages, seed, model, reply_tokens)
    if max_tokens is not None:
        tokens = tokens[:max_tokens]
    return tokens


def expected_text(
    messages: Sequence[Mapping[str, Any]] | Any,
    seed: int = 0,
    model: str = "sim",
    reply_tokens: int = 120,
    max_tokens: int | None = None,
) -> str:
    """The full reply text (joined pieces) the simulator produces for this request."""
    return "".join(expected_tokens(messages, seed, model, reply_tokens, max_tokens))


_ROUGH_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return " ".join(parts)
    return ""


def count_prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """A deterministic, tokenizer-like estimate of the prompt's size."""
    total = 3
    for message in messages:
        content = message.get("content")
        total += 4 + len(_ROUGH_TOKEN_RE.findall(_content_text(content)))
        if isinstance(content, list):  # an image part: a low-detail image's 85 tokens
            total += 85 * sum(1 for p in content if isinstance(p, Mapping) and p.get("type") == "image_url")
    return total


# --- cutting a reply's text back into the pieces it was streamed as -----------------------

# Outside fenced code, in the order the alternatives must be tried: a fence, paragraph
# and line breaks, heading marks, bold and inline-code marks (with their optional
# leading space), words and numbers (with theirs), then any other single character.
_SPLIT_RE = re.compile(r"```|\n\n|\n|#+| ?\*\*| ?`| ?[A-Za-z_]+| ?\d+| ?[^\sA-Za-z_\d]|.", re.S)


def split_tokens(text: str) -> list[str]:
    """Cut the text of a simulated reply back into the tokens it was streamed as.

    ``split_tokens("".join(simulated_tokens(...))) == simulated_tokens(...)``, and for
    a prefix that ends on a token boundary the result is that prefix's tokens. Load
    generators use it to learn which token a streamed character belongs to, and so when
    the simulator sent it (``collab.simulator.timing.token_offset``). Any other text is
    cut in a tokenizer-like way (words with their leading space, punctuation alone).
    """
    out: list[str] = []
    n = len(text)
    p = 0
    in_code = False  # inside `inline code`: the next token runs to the closing backtick
    while p < n:
        if in_code:
            end = text.find("`", p)
            newline = text.find("\n", p)
            if newline != -1 and (end == -1 or newline < end):
                in_code = False  # never closed on this line: carry on as prose
                continue
            if end == -1:  # a prefix that stops inside the code: the rest is one token
                out.append(text[p:])
                break
            if end > p:
                out.append(text[p:end])
            out.append("`")
            p = end + 1
            in_code = False
            continue
        m = _SPLIT_RE.match(text, p)
        assert m is not None  # the last alternative matches any character
        token = m.group()
        p = m.end()
        if token == "```":
            out.append(token)
            # ```python\n<source>\n```: the info string and the newline are tokens of
            # their own, the source is cut as the simulator cuts code.
            info = re.match(r"[A-Za-z_]+", text[p:])
            if info is not None:
                out.append(info.group())
                p += info.end()
            if text.startswith("\n", p):
                out.append("\n")
                p += 1
            close = text.find("\n```", p)
            source = text[p:] if close == -1 else text[p:close]
            out += _cut(source)
            if close == -1:
                break
            out += ["\n", "```"]
            p = close + 4
            continue
        out.append(token)
        if token == " `":
            in_code = True
    return out
