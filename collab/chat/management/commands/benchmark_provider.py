"""`python manage.py benchmark_provider NAME [--runs N] [--json FILE]`"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from collab.chat.models import Provider
from collab.chat.services import providers
from collab.llm.benchmark import SCENARIOS, benchmark, format_table
from collab.llm.client import aclose_clients


async def _run(provider: Provider, model: str, runs: int, max_tokens: int) -> dict[str, Any]:
    try:
        results = await benchmark(
            providers.provider_config(provider),
            model,
            runs=runs,
            max_tokens=max_tokens,
            prices=(provider.price_input_per_m, provider.price_output_per_m),
        )
    finally:
        await aclose_clients()
    return {"table": format_table(results), "scenarios": {k: v.summary() for k, v in results.items()}}


def run_benchmark(provider: Provider, model: str = "", runs: int = 3, max_tokens: int = 400) -> dict[str, Any]:
    """Benchmark one provider (the command and the admin action)."""
    return asyncio.run(_run(provider, model or provider.default_model, runs, max_tokens))


class Command(BaseCommand):
    help = f"Stream three prompts ({', '.join(SCENARIOS)}) through a provider; print TTFT, tokens/s, time and cost."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the provider's name (see the admin)")
        parser.add_argument("--runs", type=int, default=3)
        parser.add_argument("--model", default="", help="default: the provider's default model")
        parser.add_argument("--max-tokens", type=int, default=400)
        parser.add_argument("--json", dest="json_file", help="also write the figures as JSON")

    def handle(self, *args: Any, **opts: Any) -> None:
        providers.ensure_default_assistant()  # providers from the environment exist by now
        provider = Provider.objects.filter(name=opts["name"]).first()
        if provider is None:
            names = ", ".join(Provider.objects.values_list("name", flat=True)) or "none"
            raise CommandError(f"no provider named {opts['name']!r} (known: {names})")
        if not 1 <= opts["runs"] <= 100 or not 1 <= opts["max_tokens"] <= 32_000:
            raise CommandError("--runs is 1-100 and --max-tokens 1-32000")
        model = opts["model"] or provider.default_model
        self.stdout.write(
            f"Benchmarking {provider.name} ({provider.base_url}, model {model}), {opts['runs']} run(s) ..."
        )
        result = run_benchmark(provider, model, opts["runs"], opts["max_tokens"])
        self.stdout.write(result["table"])
        if opts["json_file"]:
            payload = {
                "provider": provider.name,
                "base_urls": provider.base_urls,
                "model": model,
                "runs": opts["runs"],
                "max_tokens": opts["max_tokens"],
                "scenarios": result["scenarios"],
            }
            Path(opts["json_file"]).write_text(json.dumps(payload, indent=1))
        if all(not s["runs"] for s in result["scenarios"].values()):
            raise CommandError("every run failed")
