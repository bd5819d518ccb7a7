"""What the simulated model's replies are made of (text.py): common words, sentence
starters, inline code, and code blocks to fill in. Changing any of it changes every
simulated reply (and the expected texts the tests compare with)."""

from __future__ import annotations

WORD_LIST = """
    the a of to and in is that for it as with on this be are by an or from at
    which you can we not will if but all more one when so each into your its
    their there what also about some other than then only any both them these
    way new first may like use used using data value values model models token
    tokens request requests response server client stream streaming message
    messages user users system network cache memory queue worker workers task
    tasks function functions method class object list string number result
    results error errors test tests example examples code file files state
    event events update updates chat room rooms reply answer question simple
    small large fast slow quickly carefully usually often rarely always never
    important useful common practical reliable predictable consistent latency
    throughput buffer connection protocol handler database query index schema
    config option options setting default timeout retry limit budget approach
    design pattern step steps process output input format markdown text line
    lines block blocks word words character simply directly rather instead
    however because although while until before after during between across
    through without within around several many most few every another same
    different specific general clear better good great well just even still
    keep make makes made take takes give gives show shows run runs return
    returns send sends receive receives handle handles check checks build
    builds write writes read reads start starts stop stops wait waits need
    needs want wants think consider note remember expect expects explain
    describe compare measure improve reduce avoid allow allows support supports
"""
WORDS: tuple[str, ...] = tuple(WORD_LIST.split())

STARTERS: tuple[str, ...] = (
    "Sure",
    "Yes",
    "Here",
    "In",
    "The",
    "This",
    "When",
    "If",
    "For",
    "Most",
    "One",
    "A",
    "To",
    "Because",
    "Each",
    "Note",
)

INLINE_CODE: tuple[str, ...] = (
    "asyncio",
    "await",
    "yield",
    "max_tokens",
    "stream",
    "None",
    "json",
    "dict",
    "list",
    "send()",
    "recv()",
    "timeout",
    "retry",
    "__init__",
)

NAMES: tuple[str, ...] = (
    "items",
    "tokens",
    "data",
    "chunk",
    "result",
    "value",
    "total",
    "buffer",
    "message",
    "count",
    "text",
    "reply",
    "state",
    "queue",
)

FUNCS: tuple[str, ...] = (
    "process",
    "render",
    "collect",
    "handle",
    "parse",
    "stream_reply",
    "merge",
    "count_words",
    "split_lines",
    "normalize",
)

CODE_TEMPLATES: tuple[tuple[str, ...], ...] = (
    (
        "def {f}({a}):",
        '    """Return the {b} for {a}."""',
        "    {b} = []",
        "    for {c} in {a}:",
        "        if {c}:",
        "            {b}.append({c})",
        "    return {b}",
    ),
    (
        "async def {f}({a}, timeout=5.0):",
        "    async with asyncio.timeout(timeout):",
        "        {b} = await {a}.read()",
        "    return {b}.decode()",
    ),
    (
        "import json",
        "",
        "{b} = json.loads({a})",
        'print({b}.get("{c}", 0))',
    ),
    (
        "class {F}:",
        "    def __init__(self, {a}):",
        "        self.{a} = {a}",
        "",
        "    def {f}(self):",
        "        return len(self.{a})",
    ),
    (
        "{b} = {{}}",
        "for {c} in {a}:",
        "    {b}[{c}] = {b}.get({c}, 0) + 1",
        "print(sorted({b}.items()))",
    ),
)
