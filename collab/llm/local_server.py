"""llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`, the same
command line), with llama.cpp's extra weight buffers off (`use_extra_bufts`: weights
repacked at load for the CPU's matrix units).

On a CPU with AMX (Intel Sapphire Rapids and later), llama-cpp-python 0.3.36 built for
the machine repacks SmolLM2's Q4_1 weights into AMX buffers and the server segfaults at
the first completion, with or without flash attention (seen 2026-12-03: `Llama(...)`
then `create_chat_completion` alone crashed; with the buffers off it answered). Where
repacking would work it may be faster; that was not measured. The server has no option
for it, so the default model parameters are wrapped before it starts.
"""

from __future__ import annotations

from typing import Any


def without_extra_buffers() -> None:
    """Every llama.cpp model loaded from here on keeps its weights in plain CPU buffers."""
    import llama_cpp.llama_cpp as lib

    default = lib.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    lib.llama_model_default_params = params


def main() -> None:
    without_extra_buffers()
    from llama_cpp.server.__main__ import main as serve

    serve()


if __name__ == "__main__":
    main()
