"""How fast and how dear a provider is, on three kinds of prompt a team sends.

Measures time to first token (from the request leaving, after any queue), output
tokens/s counted in tokens (the provider's `usage` when it sends one, else one per
streamed chunk — what OpenAI-compatible servers send), total time, and cost per
million tokens from the provider's prices.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any

from collab.llm.client import Finish, LLMError, Usage
from collab.llm.pool import ProviderConfig, stream_reply

SCENARIOS: dict[str, str] = {
    "code": (
        "Write a Python function `parse_duration(text: str) -> int` that turns strings like '1h30m', "
        "'45s' or '2h' into seconds, raising ValueError on bad input. Then write five pytest tests for it."
    ),
    "summary": (
        "Summarise for an engineering team, in about 200 words, the trade-offs between server-sent events, "
        "WebSockets and long polling for streaming AI replies to browsers: latency, proxies, reconnects, cost."
    ),
    "reasoning": (
        "A train leaves at 09:40 and travels 180 km at 120 km/h, waits 12 minutes, then travels 95 km at "
        "75 km/h. At what time does it arrive? Reason step by step, then give the answer on its own line."
    ),
}


@dataclass
class Run:
    ttft_ms: float
    output_tokens: int
    tokens_per_s: float | None
    total_s: float
    prompt_tokens: int
    cost: Decimal


@dataclass
class ScenarioResult:
    runs: list[Run] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def spread(self, name: str) -> dict[str, float] | None:
        values = [float(v) for r in self.runs if (v := getattr(r, name)) is not None]
        if not values:
            return None
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    def cost_per_m_tokens(self) -> float | None:
        tokens = sum(r.output_tokens + r.prompt_tokens for r in self.runs)
        return float(sum(r.cost for r in self.runs) * 1_000_000 / tokens) if tokens else None

    def summary(self) -> dict[str, Any]:
        return {
            "ttft_ms": self.spread("ttft_ms"),
            "tokens_per_s": self.spread("tokens_per_s"),
            "total_s": self.spread("total_s"),
            "output_tokens": self.spread("output_tokens"),
            "cost_per_m_tokens": self.cost_per_m_tokens(),
            "runs": [{k: (str(v) if isinstance(v, Decimal) else v) for k, v in asdict(r).items()} for r in self.runs],
            "failures": self.failures,
        }


async def one_run(
    config: ProviderConfig, model: str, prompt: str, max_tokens: int, prices: tuple[Decimal, Decimal]
) -> Run:
    loop = asyncio.get_running_loop()
    messages = [{"role": "user", "content": prompt}]
    sent = loop.time()
    first: float | None = None
    last = sent
    chunks = 0
    usage: Usage | None = None

    async def on_started(_url: str) -> None:
        nonlocal sent
        sent = loop.time()

    async with (
        asyncio.timeout(config.total_timeout_s),
        aclosing(stream_reply(config, model, messages, max_tokens=max_tokens, on_started=on_started)) as stream,
    ):
        async for items in stream:
            for item in items:
                if isinstance(item, Usage):
                    usage = item
                    continue
                if isinstance(item, Finish):
                    continue
                last = loop.time()
                if first is None:
                    first = last
                chunks += 1
    if first is None:
        raise LLMError("server", "the provider sent no text")
    tokens = usage.completion_tokens if usage and usage.completion_tokens else chunks
    prompt_tokens = usage.prompt_tokens if usage and usage.prompt_tokens else len(prompt) // 4
    streaming = last - first
    return Run(
        ttft_ms=(first - sent) * 1000,
        output_tokens=tokens,
        tokens_per_s=(tokens - 1) / streaming if tokens > 1 and streaming > 0 else None,
        total_s=last - sent,
        prompt_tokens=prompt_tokens,
        cost=(prices[0] * prompt_tokens + prices[1] * tokens) / Decimal(1_000_000),
    )


async def benchmark(
    config: ProviderConfig,
    model: str,
    *,
    runs: int = 3,
    max_tokens: int = 400,
    prices: tuple[Decimal, Decimal] = (Decimal(0), Decimal(0)),
    scenarios: Sequence[str] = tuple(SCENARIOS),
) -> dict[str, ScenarioResult]:
    """Run every scenario `runs` times, one request at a time (so the figures are the
    provider's, not a queue's)."""
    results = {name: ScenarioResult() for name in scenarios}
    for _ in range(runs):
        for name in scenarios:
            try:
                results[name].runs.append(await one_run(config, model, SCENARIOS[name], max_tokens, prices))
            except (LLMError, TimeoutError) as exc:
                results[name].failures.append(str(exc) or "timed out")
    return results


def format_table(results: dict[str, ScenarioResult]) -> str:
    def cell(spread: dict[str, float] | None, fmt: str) -> str:
        if spread is None:
            return "-"
        return f"{spread['median']:{fmt}} ({spread['min']:{fmt}}-{spread['max']:{fmt}})"

    header = (
        f"{'scenario':<10} {'ok':>4} {'TTFT ms':>22} {'tokens/s':>22} {'total s':>20} {'tokens':>6} {'$/1M tok':>9}"
    )
    lines = [header, "-" * len(header)]
    for name, result in results.items():
        summary = result.summary()
        tokens = summary["output_tokens"]
        cost = summary["cost_per_m_tokens"]
        lines.append(
            f"{name:<10} {len(result.runs):>2}/{len(result.runs) + len(result.failures):<1} "
            f"{cell(summary['ttft_ms'], '.0f'):>22} {cell(summary['tokens_per_s'], '.0f'):>22} "
            f"{cell(summary['total_s'], '.2f'):>20} {tokens['median'] if tokens else 0:>6.0f} "
            f"{'-' if cost is None else f'{cost:.4f}':>9}"
        )
        lines.extend(f"   failed: {failure}" for failure in result.failures[:3])
    lines.append("medians, with (min-max) over the runs; tokens/s counted after the first token")
    return "\n".join(lines)
