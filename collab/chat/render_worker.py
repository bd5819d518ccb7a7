"""A render worker: `python -m collab.chat.render_worker`, started by render_pool.Pool.

Reads a request on stdin, writes its HTML on stdout, one at a time, until stdin closes
(its server ended, or dropped it). Imports markup.py and its libraries, not Django.
"""

from __future__ import annotations

import os
import select
import signal
import sys

from collab.chat.render_pool import REPLY, REQUEST

# The pool kills a worker at its render's deadline; a worker whose server died meanwhile
# (no one left to kill it) ends itself this long after.
ORPHAN_GRACE_S = 5.0


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's: the closed stdin ends this process
    from collab.chat.markup import HIGHLIGHT_BUDGET_S, LEXERS, _lexer, render_now

    # The allow-list's lexers are made (their modules imported: ~0.7 s for all) while no
    # render waits, the common ones first: else a worker's first Python block costs ~40 ms more.
    for alias in dict.fromkeys(LEXERS.values()):
        if select.select([0], [], [], 0)[0]:
            break
        _lexer(alias)
    # The replies go out on a copy of stdout, and stdout itself becomes stderr: a library
    # that prints cannot break a reply.
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while len(header := requests.read(REQUEST.size)) == REQUEST.size:
        user, left, size = REQUEST.unpack(header)
        text = requests.read(size).decode("utf-8", "surrogatepass")
        signal.setitimer(signal.ITIMER_REAL, max(left, 0.0) + ORPHAN_GRACE_S)  # SIGALRM's default: the end
        try:
            # Highlighting stops in time to leave half of what is left to parse and clean:
            # a render that has waited in the queue still ends highlighted up to there.
            ok, out = True, render_now(text, user=user, highlight_s=min(HIGHLIGHT_BUDGET_S, left / 2))
        except Exception as exc:  # a renderer's bug: told to the pool, which shows the text plain
            ok, out = False, f"{type(exc).__name__}: {exc}"
        signal.setitimer(signal.ITIMER_REAL, 0)
        body = out.encode("utf-8", "surrogatepass")
        replies.write(REPLY.pack(ok, len(body)) + body)
        replies.flush()


if __name__ == "__main__":
    main()
