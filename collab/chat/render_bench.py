"""The render budget's benchmark: a fuzz search for the slowest text to render, and what
that text costs before and after the budget (docs/benchmarks/render-budget.md).

    python -m collab.chat.render_bench [--seconds 60] [--before-seconds 30] [--timeout 30]

1. "before": hypothesis searches texts of at most --before-chars (so that none runs for
   hours in this process) for the slowest under the renderer as it was (any Pygments
   lexer, no caps, no budget: render_before), the known cases (KNOWN, made that long)
   first, then steering by CPU time;
2. "after": the same search, texts of up to 8,000 characters (a post's cap), the known
   cases first, for the slowest under markup.render_now (the caps, no deadline: what a
   worker spends);
3. a table of the known cases, the worst of each search, and the worst "before" text
   made 8,000 long: each timed before (in a child process, stopped at --timeout), after
   in process, and through markup.render_user_markdown (the worker pool and its
   deadline: the time a member waits, and whether it rendered or fell back to plain).

Needs the dev extra (hypothesis). tests/test_render_budget.py uses the strategies below.
"""

from __future__ import annotations

import argparse
import functools
import html as html_lib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, example, given, seed, settings, target
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import get_all_lexers, get_lexer_by_name
from pygments.util import ClassNotFound

from collab.chat import markup, render_pool

POST_CHARS = 8_000

# --- what the search draws ------------------------------------------------------------

ALL_LEXER_NAMES = sorted({alias for _, aliases, _, _ in get_all_lexers() for alias in aliases})
# Pieces that lexers' and markdown-it's rules treat specially: runs of one, alternations
# of two and a closing one after a run are what superlinear regexes and scans are made of.
FRAGMENTS = [
    " ", "\t", "\n", " \n", "\t\n", "x", "0", "'", '"', "`", "\\", "/", "*", "#", "<", ">", "{", "}",
    "(", ")", "[", "]", "$", "@", "%", "-", "=", ":", ";", ",", ".", "!", "&", "|", "?", "_", "~",
    "+", "^", "/*", "//", "<!--", "--", "<<", "${", "#{", '"""', '\\"', "\\'", "0x", "\\\n", "a b",
    "<a", "&a;", "$(", "{{", "%}", "::", "=>", "```", "> ", "- ", "1. ", "![", "[a]", "](", "*_",
    "**a", "[a]: b\n", "| a |\n", "    ", "\n\n", "x=", "._", "_?",
]  # fmt: skip
KNOWN: list[tuple[str, str]] = [
    ("systemd, a line of 7,984 spaces then x", "```systemd\n" + " " * 7_984 + "x\n```"),
    ("zeek, the same", "```zeek\n" + " " * 7_987 + "x\n```"),
    ("mcfunction, the same", "```mcfunction\n" + " " * 7_981 + "x\n```"),
    ("easytrieve, tabs then x", "```easytrieve\n" + "\t" * 7_981 + "x\n```"),
    ("python, 3,990 blank lines", "```python\n" + " \n" * 3_990 + "```"),
    ("javascript, escaped quotes", '```js\n"' + '\\"' * 3_990 + "\n```"),
    ("8,000 characters of ![", "![" * 4_000),
    ("8,000 characters of [", "[" * 8_000),
    ("nested emphasis *_", "*_" * 4_000),
    ("backticks", "`" * 8_000),
    ("<", "<" * 8_000),
    ("link reference definitions", "[a]: b\n" * 1_142),
    ("quotes > > >", "> " * 4_000),
    ("an ordinary post", "Could @a look at **this**? It fails on `x = f(y)`:\n\n```python\nx = f(y)\n```\n"),
]


@st.composite
def bodies(draw: st.DrawFn, max_chars: int) -> str:
    """A run of a short pattern (what makes scans superlinear), between a prefix and a
    suffix, up to `max_chars`."""
    pattern = "".join(draw(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=3)))
    size = draw(st.integers(1, max_chars))
    prefix = draw(st.sampled_from(["", *FRAGMENTS]))
    suffix = draw(st.sampled_from(["", *FRAGMENTS]))
    return (prefix + pattern * (size // len(pattern) + 1))[: size - len(suffix)] + suffix


@st.composite
def documents(draw: st.DrawFn, max_chars: int = POST_CHARS, lexers: list[str] | None = None) -> str:
    """A fenced block in any language (any Pygments name, the allow-list's, none, unknown)
    around a pathological body, or the body as Markdown itself, or both."""
    names = lexers if lexers is not None else [*ALL_LEXER_NAMES, *markup.LEXERS, "", "nosuchlang"]
    body = draw(bodies(max_chars - 40))
    shape = draw(st.sampled_from(["fence", "markdown", "quoted fence"]))
    if shape == "markdown":
        return body
    fence = f"```{draw(st.sampled_from(names))}\n{body}\n```"
    return fence if shape == "fence" else "> " + fence.replace("\n", "\n> ")


# --- the renderer as it was -------------------------------------------------------------

_formatter = HtmlFormatter(nowrap=True)


@functools.cache
def _lexer_before(name: str) -> Lexer | None:
    try:
        return get_lexer_by_name(name)
    except ClassNotFound:
        return None


def _highlight_before(code: str, lang: str, _attrs: str) -> str:
    lexer = _lexer_before(lang.strip().split()[0]) if lang.strip() else None
    return html_lib.escape(code) if lexer is None else str(highlight(code, lexer, _formatter))


def _parser_before(user: bool) -> MarkdownIt:
    md = MarkdownIt(
        "js-default", {"highlight": _highlight_before, "linkify": False, "typographer": False, "breaks": user}
    ).enable("table")
    md.add_render_rule("image", markup._image)
    return markup.as_typed(md) if user else md  # people's dialect is today's: the caps are what is compared


_before = {user: _parser_before(user) for user in (False, True)}


def render_before(text: str, user: bool = True) -> str:
    """The renderer as it was (markup.py at f8f1ec3): any Pygments lexer, no caps, no
    budget, in the caller's thread."""
    return markup._clean(_before[user].render(markup._LONE_SURROGATE.sub("\ufffd", text)))


def _timed(render: Callable[[str], object], text: str) -> float:
    start = time.perf_counter()
    render(text)
    return time.perf_counter() - start


def _best(render: Callable[[str], object], text: str, runs: int = 3) -> float:
    """The least of a few runs (one if it is slow): other processes on the machine add
    their time to any one run, never take it away."""
    times = [_timed(render, text)]
    while len(times) < runs and times[0] < 1.0:
        times.append(_timed(render, text))
    return min(times)


def _cpu(render: Callable[[str], object], text: str) -> float:
    """This thread's CPU time for a render: what the search steers by, as other processes'
    load changes the wall time of any one run."""
    start = time.thread_time()
    render(text)
    return time.thread_time() - start


def _warm_lexers() -> None:
    """Import every lexer's module first: the first use of one takes up to ~0.5 s of
    imports, which is no render's time."""
    for alias in ALL_LEXER_NAMES:
        _lexer_before(alias)


def time_before(text: str, timeout: float) -> float | None:
    """render_before's time for `text` in a child process, None past `timeout` (the child
    is killed: some of these run for hours)."""
    code = "from collab.chat.render_bench import _time_stdin; _time_stdin()"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], input=text.encode("utf-8", "surrogatepass"), capture_output=True,
            timeout=timeout, env=render_pool._worker_env(), check=True,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    return float(done.stdout)


def _time_stdin() -> None:
    """The child of time_before: the least of two runs, one if it is slow (the first
    run of a lexer imports its module)."""
    text = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
    print(_best(render_before, text, runs=2))


# --- the allow-list's lexers, one by one --------------------------------------------------

# What superlinear lexer regexes are made of (a run, an alternation, a closing piece):
# the sweep tries every pair.
LEXER_FRAGMENTS = [
    " ", "\t", "x", "0", "'", '"', "`", "\\", "/", "*", "#", "<", ">", "{", "}", "(", ")", "[", "]", "$",
    "@", "%", "-", "=", ":", ";", ",", ".", "&", "|", "?", "_", "/*", "<!--", "${", '"""', "0x", "a b", "<a", "::",
]  # fmt: skip


@dataclass
class LexerCost:
    alias: str
    gap_s: float = 0.0  # the longest time between two tokens: what no time check can cut
    gap_body: str = ""
    block_s: float = 0.0  # the longest block of lines of HIGHLIGHT_MAX_CHARS
    block_body: str = ""


def _tokens_timed(lexer: Lexer, code: str) -> tuple[float, float]:
    """(longest gap between two tokens, total) for lexing `code`, in this thread's CPU
    time: the machine's other processes would add theirs to any gap."""
    start = last = time.thread_time()
    gap = 0.0
    for _ in lexer.get_tokens(code):
        now = time.thread_time()
        gap, last = max(gap, now - last), now
    return gap, last - start


def lexer_costs(alias: str) -> LexerCost:
    """One lexer of the allow-list against every pair of LEXER_FRAGMENTS: as one line of
    HIGHLIGHT_MAX_LINE characters (a run then a closing piece, an alternation), and each
    fragment in lines up to HIGHLIGHT_MAX_CHARS."""
    lexer = markup._lexer(alias)
    cost = LexerCost(alias)
    line = markup.HIGHLIGHT_MAX_LINE
    for a, b in itertools.product(LEXER_FRAGMENTS, LEXER_FRAGMENTS):
        for body in ((a * line)[: line - len(b)] + b, ((a + b) * line)[:line]):
            gap, _ = _tokens_timed(lexer, body)
            if gap > cost.gap_s:
                cost.gap_s, cost.gap_body = gap, body
    for a in LEXER_FRAGMENTS:
        body = ((a * 80)[:79] + "\n") * (markup.HIGHLIGHT_MAX_CHARS // 80)
        gap, total = _tokens_timed(lexer, body)
        if gap > cost.gap_s:
            cost.gap_s, cost.gap_body = gap, body
        if total > cost.block_s:
            cost.block_s, cost.block_body = total, body
    return cost


# --- the search ---------------------------------------------------------------------------


class _TimeUp(Exception):
    pass


@dataclass
class Found:
    examples: int = 0
    worst_s: float = 0.0
    worst: str = ""


def search(
    render: Callable[[str], object], strategy: st.SearchStrategy[str], seconds: float, at: int, seeds: list[str]
) -> Found:
    """The slowest text hypothesis finds for `render` in `seconds`, the `seeds` first,
    steering toward the slowest (hypothesis.target: this thread's CPU time)."""
    found = Found()
    stop = time.monotonic() + seconds

    def one(text: str) -> None:
        if time.monotonic() > stop:
            raise _TimeUp
        elapsed = _cpu(render, text)
        found.examples += 1
        target(elapsed)
        if elapsed > found.worst_s:
            found.worst_s, found.worst = elapsed, text

    test = given(strategy)(one)
    for text in seeds:
        test = example(text)(test)
    test = settings(
        max_examples=10**9, deadline=None, database=None, phases=[Phase.explicit, Phase.generate, Phase.target],
        suppress_health_check=list(HealthCheck),
    )(test)  # fmt: skip
    try:
        seed(at)(test)()
    except* _TimeUp:  # hypothesis may report it from more than one place: a group
        pass
    return found


def resize(text: str, chars: int) -> str:
    """`text` made about `chars` long by repeating its middle's period more or fewer
    times: a pathological run keeps its shape, its fence and its ends (the spaces before
    systemd's `x`). A text with no short period in its middle is returned as it is."""
    mid = len(text) // 2
    for period in range(1, 13):
        start, end = mid, mid + period
        if end > len(text):
            break
        while start > 0 and text[start - 1] == text[start - 1 + period]:
            start -= 1
        while end < len(text) and text[end] == text[end - period]:
            end += 1
        if end - start >= 4 * period:  # a run, not a coincidence
            run = max(period, end - start + chars - len(text))
            unit = text[start : start + period]
            return text[:start] + unit * (run // period) + unit[: run % period] + text[end:]
    return text


def describe(text: str, shown: int = 60) -> str:
    return f"{json.dumps(text[:shown])}{'...' if len(text) > shown else ''} ({len(text):,} chars)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60, help="the 'after' search's time")
    parser.add_argument("--before-seconds", type=float, default=30, help="the 'before' search's time")
    parser.add_argument("--before-chars", type=int, default=600, help="the 'before' search's longest text")
    parser.add_argument("--timeout", type=float, default=30, help="a 'before' render is stopped after this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--lexers", nargs="*", metavar="ALIAS", help="instead: sweep these lexers (none named: the allow-list's)"
    )
    args = parser.parse_args(argv)
    if args.lexers is not None:
        print(f"{'lexer':12} {'longest gap':>12}  {'on':44} {'block':>8}  on (CPU time)")
        for alias in args.lexers or sorted(set(markup.LEXERS.values())):
            cost = lexer_costs(alias)
            print(
                f"{alias:12} {cost.gap_s * 1e3:9.1f} ms  {describe(cost.gap_body, 16):44} "
                f"{cost.block_s * 1e3:5.0f} ms  {describe(cost.block_body, 16)}",
                flush=True,
            )
        return

    budget = render_pool.budget_s()
    print(f"render budget {budget:g} s, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    print(
        f"caps: {len(set(markup.LEXERS.values()))} lexers; highlighting {markup.HIGHLIGHT_MAX_CHARS:,} chars a block, "
        f"{markup.HIGHLIGHT_TOTAL_CHARS:,} a text, {markup.HIGHLIGHT_BUDGET_S:g} s; "
        f"links off past {markup.LINK_OPENERS_MAX:,} '['"
    )
    cases = list(KNOWN)
    _warm_lexers()
    if args.before_seconds > 0:
        seeds = [resize(text, args.before_chars) for _, text in KNOWN]
        found = search(render_before, documents(args.before_chars), args.before_seconds, args.seed, seeds)
        print(f"before: {found.examples:,} texts in {args.before_seconds:g} s, slowest {found.worst_s:.3f} s of CPU:")
        print(f"    {describe(found.worst)}")
        cases += [("before search's slowest", found.worst), ("  made 8,000 long", resize(found.worst, POST_CHARS))]
    if args.seconds > 0:
        render = functools.partial(markup.render_now, user=True)
        found = search(render, documents(), args.seconds, args.seed, [text for _, text in KNOWN])
        print(f"after: {found.examples:,} texts in {args.seconds:g} s, slowest {found.worst_s:.3f} s of CPU:")
        print(f"    {describe(found.worst)}")
        cases.append(("after search's slowest", found.worst))

    markup.render_user_markdown("warm")  # the pool's workers start
    print(f"\n{'case':40} {'chars':>6} {'before':>9} {'after':>9} {'render_user_markdown':>22}")
    for name, text in cases:
        before = time_before(text, args.timeout)
        after = _best(lambda t: markup.render_now(t, user=True), text)
        outcomes = dict(render_pool.pool().outcomes)
        waited = _timed(markup.render_user_markdown, text)  # once: the outcome below is this run's
        how = next((k for k, v in render_pool.pool().outcomes.items() if v > outcomes.get(k, 0)), "?")
        shown_before = f"> {args.timeout:g} s" if before is None else f"{before:.3f} s"
        print(f"{name:40} {len(text):6,} {shown_before:>9} {after:7.3f} s {waited:7.3f} s {how:>12}")


if __name__ == "__main__":
    main()
