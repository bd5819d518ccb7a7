"""Command-line options shared by ``manage.py simulate_model`` and ``python -m collab.simulator``."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from .config import FAULT_KINDS, SimConfig

__all__ = ["add_arguments", "config_from_options", "main"]


def _probability(value: str) -> float:
    p = float(value)
    if not 0.0 <= p <= 1.0:
        raise argparse.ArgumentTypeError("must be within [0, 1]")
    return p


def _positive_float(value: str) -> float:
    v = float(value)
    if not v > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return v


def _non_negative_float(value: str) -> float:
    v = float(value)
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return v


def _non_negative_int(value: str) -> int:
    v = int(value)
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return v


def _positive_int(value: str) -> int:
    v = int(value)
    if v < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return v


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = SimConfig()
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_non_negative_int, default=8001, help="port (default 8001; 0 picks a free one)")
    parser.add_argument(
        "--tps",
        type=_positive_float,
        default=defaults.tps,
        help=f"tokens per second (default {defaults.tps:g})",
    )
    parser.add_argument(
        "--ttft-ms",
        type=_non_negative_float,
        default=defaults.ttft_ms,
        help=f"time to first token in ms (default {defaults.ttft_ms:g})",
    )
    parser.add_argument(
        "--tick-ms",
        type=_non_negative_float,
        default=defaults.tick_ms,
        help=f"min ms between two writes of a stream; due tokens are batched (default {defaults.tick_ms:g})",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="text and fault RNG seed (default 0)")
    parser.add_argument(
        "--reply-tokens",
        type=_positive_int,
        default=defaults.reply_tokens,
        help=f"reply length before max_tokens (default {defaults.reply_tokens})",
    )
    parser.add_argument(
        "--fault",
        choices=FAULT_KINDS,
        default="none",
        help="fault for requests whose model name names none (default none)",
    )
    parser.add_argument(
        "--fault-after",
        type=_non_negative_int,
        default=defaults.fault_after,
        help=f"tokens before a stall/drop (default {defaults.fault_after})",
    )
    parser.add_argument(
        "--fault-rate",
        type=_probability,
        default=defaults.fault_rate,
        help="probability of --fault per request (default 1)",
    )
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    parser.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=defaults.max_body_bytes,
        help="request body cap (413 above)",
    )


def config_from_options(options: Mapping[str, Any]) -> SimConfig:
    return SimConfig(
        tps=options["tps"],
        ttft_ms=options["ttft_ms"],
        tick_ms=options["tick_ms"],
        seed=options["seed"],
        reply_tokens=options["reply_tokens"],
        fault=options["fault"],
        fault_after=options["fault_after"],
        fault_rate=options["fault_rate"],
        api_key=options["api_key"],
        max_body_bytes=options["max_body_bytes"],
    )


def main(argv: list[str] | None = None) -> None:
    from .server import serve

    parser = argparse.ArgumentParser(
        prog="python -m collab.simulator", description="OpenAI-compatible simulated model server"
    )
    add_arguments(parser)
    options = vars(parser.parse_args(argv))
    serve(config_from_options(options), options["host"], options["port"])
