"""A stand-in render worker that speaks render_pool's wire (tests/test_render_budget.py).

A text holding "hang" never ends (the pool must kill it), "die" exits mid-render, "raise"
is a renderer's error; any other is answered `<p>TEXT</p>` with this worker's pid.
"""

from __future__ import annotations

import os
import signal
import sys

from collab.chat.render_pool import REPLY, REQUEST


def main() -> None:
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    while len(header := requests.read(REQUEST.size)) == REQUEST.size:
        _user, _left, size = REQUEST.unpack(header)
        text = requests.read(size).decode("utf-8", "surrogatepass")
        if "hang" in text:
            signal.pause()  # until the pool's SIGKILL
        if "die" in text:
            os._exit(3)
        ok = "raise" not in text
        body = (f"<p>{text[:20]} pid={os.getpid()}</p>" if ok else "ValueError: raised").encode()
        replies.write(REPLY.pack(ok, len(body)) + body)
        replies.flush()


if __name__ == "__main__":
    main()
