"""Simulator settings and the fault syntax of model names.

A request's ``model`` is ``BASE`` optionally followed by ``+SPEC`` parts:

========================  =====================================================
``sim``                   normal reply (any base name works; it seeds the text)
``sim+429``               HTTP 429, ``Retry-After: 1``, code rate_limit_exceeded
``sim+quota``             HTTP 429, code insufficient_quota, no Retry-After
``sim+500``               HTTP 500, OpenAI-shaped server error
``sim+stall@N``           N content tokens, then silence until the client leaves
``sim+drop@N``            N content tokens, then the connection is cut mid-body
``sim+slow``              tps divided by 10 (combines: ``sim+slow+drop@3``)
``sim+think@N``           N reasoning tokens (``delta.reasoning_content``, vLLM's
                          field) before the answer
``sim+reasoning@N``       the same in ``delta.reasoning`` (Cerebras', OpenRouter's)
========================  =====================================================

``stall``/``drop`` without ``@N`` use the server's ``fault_after``. At most one
of 429/quota/500/stall/drop per name; anything else after a ``+`` is a 400.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

FaultKind = Literal["none", "429", "quota", "500", "stall", "drop"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
SLOW_FACTOR = 10.0
_MODEL_FAULTS: dict[str, FaultKind] = {
    "429": "429",
    "quota": "quota",
    "500": "500",
    "stall": "stall",
    "drop": "drop",
}

__all__ = [
    "FAULT_KINDS",
    "FaultKind",
    "ModelSpec",
    "SimConfig",
    "parse_model",
]


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """How the simulated model behaves. Every field has a usable default."""

    tps: float = 50.0
    """Content tokens per second after the first one."""
    ttft_ms: float = 200.0
    """Delay from request receipt to the first content token."""
    seed: int = 0
    reply_tokens: int = 120
    """Length of every reply before ``max_tokens`` truncation."""
    tick_ms: float = 0.0
    """Minimum time between two writes of one stream (0: write at every due time).
    Tokens that fall due in between go out together at the next tick: fewer,
    larger writes, each token at most ``tick_ms`` later than its due time."""
    fault: FaultKind = "none"
    """Fault applied to requests whose model name names none."""
    fault_after: int = 5
    """Tokens sent before a stall/drop (CLI fault, or ``stall``/``drop`` without ``@N``)."""
    fault_rate: float = 1.0
    """Probability that ``fault`` hits a request (drawn from an RNG seeded by ``seed``)."""
    api_key: str | None = None
    """When set, requests need ``Authorization: Bearer <api_key>``."""
    max_body_bytes: int = 20_000_000  # images as data URLs: a few MB each (OpenAI takes up to 20 MB an image)
    models: tuple[str, ...] = ("sim",)
    """Names listed by ``GET /v1/models`` (any name is served anyway)."""

    def __post_init__(self) -> None:
        if not self.tps > 0:
            raise ValueError("tps must be > 0")
        if self.ttft_ms < 0:
            raise ValueError("ttft_ms must be >= 0")
        if self.tick_ms < 0:
            raise ValueError("tick_ms must be >= 0")
        if self.reply_tokens < 1:
            raise ValueError("reply_tokens must be >= 1")
        if self.fault not in FAULT_KINDS:
            raise ValueError(f"fault must be one of {', '.join(FAULT_KINDS)}")
        if self.fault_after < 0:
            raise ValueError("fault_after must be >= 0")
        if not 0.0 <= self.fault_rate <= 1.0:
            raise ValueError("fault_rate must be within [0, 1]")
        if self.max_body_bytes < 1:
            raise ValueError("max_body_bytes must be >= 1")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A parsed model name."""

    base: str
    fault: FaultKind = "none"
    fault_after: int | None = None
    """``N`` of ``stall@N``/``drop@N``; ``None`` means the server default."""
    slow: bool = False
    think: int = 0
    """Reasoning tokens streamed before the answer (``think@N``/``reasoning@N``)."""
    think_field: str = "reasoning_content"
    """The delta field they come in: vLLM's ``reasoning_content`` or ``reasoning``."""


_THINK_FIELDS = {"think": "reasoning_content", "reasoning": "reasoning"}


def parse_model(model: str) -> ModelSpec:
    """Parse ``BASE(+SPEC)*``; raise ``ValueError`` with a readable reason."""
    base, *specs = model.split("+")
    if not base:
        raise ValueError(f"model {model!r} has an empty base name")
    fault: FaultKind = "none"
    after: int | None = None
    slow = False
    think, think_field = 0, "reasoning_content"
    for spec in specs:
        name, sep, arg = spec.partition("@")
        if spec == "slow":
            slow = True
            continue
        if name in _THINK_FIELDS:
            if not sep or not arg.isdigit() or not arg.isascii():
                raise ValueError(f"{spec!r} in model {model!r} needs a token count, like {name}@20")
            think, think_field = int(arg), _THINK_FIELDS[name]
            continue
        if name not in _MODEL_FAULTS or (sep and name not in ("stall", "drop")):
            raise ValueError(f"unknown simulated fault {spec!r} in model {model!r}")
        if fault != "none":
            raise ValueError(f"model {model!r} names more than one fault")
        if sep:
            if not arg.isdigit() or not arg.isascii():
                raise ValueError(f"fault {spec!r} in model {model!r} needs a token count, like {name}@5")
            after = int(arg)
        fault = _MODEL_FAULTS[name]
    return ModelSpec(base=base, fault=fault, fault_after=after, slow=slow, think=think, think_field=think_field)
