"""`python -m collab.buildprogress [--log FILE] -- COMMAND ...`: runs COMMAND (the Makefile's
`pip install -v ...` of the `local` extra, which builds llama.cpp from source) and shows
only what tells how far it is: pip's own steps and summary, scikit-build-core's stages, and
the build's step counter (`[37/193] ggml-cpu.c.o`, CMake's Ninja), on a terminal as one
line updated in place with the time so far, elsewhere a line per step. Everything goes to
FILE as it came; if COMMAND fails, its last lines are shown and its exit status returned.
README "Set up" says what the user sees. No Django here: it runs before anything is set up.
"""

from __future__ import annotations

import argparse
import os
import re
import selectors
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

# pip's lines worth a line of their own: its top-level steps (no indent) and the steps of
# the package it builds (two spaces); what pip installs to build it (deeper) is not shown.
PIP_STEP = re.compile(
    r"^(?:(?:Collecting|Obtaining|Building wheels for|Installing collected packages|Successfully|Saved|ERROR)\b"
    r"|  (?:Downloading|Building (?:wheel|editable) for|Installing build dependencies)\b)"
)
# scikit-build-core's stages: "*** Configuring CMake...", "*** Building project with Ninja...".
STAGE = re.compile(r"^\s*\*\*\* ")
STEP = re.compile(r"^\s*\[(\d+)/(\d+)\]\s+(.*)$")  # Ninja's step counter, then its command or description
OUTPUT = re.compile(r"\s-o\s+(\S+)")  # the file a compiler or linker command makes
BUILT = re.compile(r"\S+\.(?:o|a|so(?:\.\d+)*)(?=\s|$)")  # else the first object or library it names
TAIL_LINES = 40


def step_label(rest: str) -> str:
    """What a build step makes, short: the file a command writes (its `-o`), else the
    first object or library it names (an archive, a library's symlinks), else what Ninja
    printed, cut short."""
    found = OUTPUT.search(rest)
    if found:
        return os.path.basename(found.group(1))
    built = BUILT.search(rest)
    return os.path.basename(built.group(0)) if built else rest.strip()[:60]


class Progress:
    """Writes what is shown of the command's lines to `out`."""

    def __init__(self, out: TextIO, tty: bool, width: int = 100) -> None:
        self.out, self.tty, self.width = out, tty, width
        self.start = time.monotonic()
        self.status = ""  # the step line a terminal shows, updated in place

    def line(self, text: str) -> None:
        step = STEP.match(text)
        if step:
            done, total, rest = step.groups()
            self.step(f"  [{done}/{total}] {step_label(rest)}")
        elif PIP_STEP.match(text) or STAGE.match(text):
            self.show(text.rstrip())

    def step(self, text: str) -> None:
        if not self.tty:
            self.out.write(text + "\n")
        else:
            self.status = text
            self.tick()

    def tick(self) -> None:
        """A terminal's step line again, with the time so far (also when no line came)."""
        if self.tty and self.status:
            elapsed = int(time.monotonic() - self.start)
            text = f"{self.status}  ({elapsed // 60}:{elapsed % 60:02d})"[: self.width - 1]
            self.out.write(f"\r\x1b[K{text}")
            self.out.flush()

    def show(self, text: str) -> None:
        self.end_status()
        self.out.write(text + "\n")
        self.out.flush()

    def end_status(self) -> None:
        if self.tty and self.status:
            self.out.write("\n")
            self.status = ""


def lines_of(chunks: Iterable[bytes]) -> Iterable[str]:
    """Lines, split at \\n and \\r (pip's progress bars rewrite a line with \\r)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = re.split(rb"\r\n|\r|\n", pending)
        yield from (line.decode("utf-8", "replace") for line in complete)
    if pending:
        yield pending.decode("utf-8", "replace")


def run(command: list[str], log: Path, out: TextIO, tty: bool) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    progress = Progress(out, tty, shutil.get_terminal_size().columns)
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with log.open("wb") as written, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()

        def chunks() -> Iterable[bytes]:
            with selectors.DefaultSelector() as selector:
                selector.register(fd, selectors.EVENT_READ)
                while True:
                    if not selector.select(timeout=1.0):
                        progress.tick()  # the clock goes on through a long step
                        continue
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        return
                    written.write(chunk)
                    yield chunk

        for text in lines_of(chunks()):
            tail.append(text)
            progress.line(text)
        code = proc.wait()
    progress.end_status()
    if code != 0:
        out.write(f"The command failed ({code}); its last lines (all of it in {log}):\n")
        out.writelines(f"  | {text}\n" for text in tail)
    out.flush()
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--log", type=Path, default=Path(".cache/build.log"), help="where the whole output goes")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")
    return run(command, args.log, sys.stdout, sys.stdout.isatty())


if __name__ == "__main__":
    sys.exit(main())
