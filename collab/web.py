"""The web process: Daphne on uvloop.

`python -m collab.web -b HOST -p PORT collab.asgi:application` takes Daphne's own
command line (`python -m daphne --help`). Daphne makes its Twisted reactor's asyncio
loop with `asyncio.new_event_loop()` when `daphne.server` is first imported, so the
loop policy set here, before that import, decides which loop it is; Twisted's
`AsyncioSelectorReactor` runs on uvloop's. uvloop alone took 15% off the server's CPU
per delivered frame, and with orjson and hiredis a third (docs/benchmarks.md, "Faster
parts for Daphne"). `python -m daphne` still works, on the standard loop.
"""

from __future__ import annotations

import asyncio


def use_uvloop() -> bool:
    """Make uvloop the loop of every loop created from here on; False where it is not
    installed (it does not build on Windows): the standard loop then, as before."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def main() -> None:
    use_uvloop()
    from daphne.cli import CommandLineInterface  # imports daphne.server: after the policy

    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
