"""Providers: endpoint pools and failover, the concurrency queue, retries (Retry-After,
final quota 429s), cost, providers from the environment, and keys that never leak."""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import Client

from collab.chat.models import Message, Provider
from collab.chat.services import providers
from collab.llm import LLMError
from collab.llm.client import aclose_clients
from collab.llm.pool import ProviderConfig, pool_for, stream_reply
from collab.simulator.app import SimulatorApp
from collab.simulator.testing import running_simulator_app
from tests.conftest import World, all_final, make_assistant, member

MESSAGES = [{"role": "user", "content": "hello"}]


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


@pytest.fixture(scope="module")
def sims() -> Iterator[list[tuple[str, Any]]]:
    """Two healthy simulators and a failing one (every request gets a 500)."""
    with (
        running_simulator_app(tps=400, ttft_ms=5, reply_tokens=20) as one,
        running_simulator_app(tps=400, ttft_ms=5, reply_tokens=20) as two,
        running_simulator_app(tps=400, ttft_ms=5, reply_tokens=20, fault="500") as bad,
    ):
        yield [one, two, bad]


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    await aclose_clients()


async def collect(config: ProviderConfig, model: str = "sim", **kw: Any) -> str:
    return "".join([x async for xs in stream_reply(config, model, MESSAGES, **kw) for x in xs if isinstance(x, str)])


# --- pools ----------------------------------------------------------------------------


async def test_failover_to_the_next_endpoint_and_avoid_the_unhealthy_one(sims: list[tuple[str, Any]]) -> None:
    (good_url, good), _, (bad_url, bad) = sims
    config = ProviderConfig(name="pool-failover", base_urls=(bad_url, good_url), max_retries=0, unhealthy_s=60)
    bad_before, good_before = bad.stats.requests, good.stats.requests
    assert await collect(config)  # the bad endpoint failed first, the good one answered
    assert (bad.stats.requests - bad_before, good.stats.requests - good_before) == (1, 1)
    assert await collect(config)  # the bad one is avoided while unhealthy
    assert (bad.stats.requests - bad_before, good.stats.requests - good_before) == (1, 2)
    states = {e.url: e for e in pool_for(config).endpoints}
    assert states[bad_url].failures == 1 and not states[bad_url].healthy(time.monotonic())


async def test_all_endpoints_failing_is_one_clear_error(sims: list[tuple[str, Any]]) -> None:
    config = ProviderConfig(name="pool-dead", base_urls=(sims[2][0], closed_port_url()), max_retries=0)
    with pytest.raises(LLMError) as err:
        await collect(config)
    assert "all 2 endpoints failed" in err.value.message


async def test_request_goes_to_the_endpoint_with_fewest_streams(sims: list[tuple[str, Any]]) -> None:
    (one_url, one), (two_url, two), _ = sims
    config = ProviderConfig(name="pool-balance", base_urls=(one_url, two_url), max_retries=0)
    before = (one.stats.requests, two.stats.requests)
    # four concurrent slow streams spread 2 + 2
    texts = await asyncio.gather(*(collect(config, model="sim+slow") for _ in range(4)))
    assert all(texts)
    assert (one.stats.requests - before[0], two.stats.requests - before[1]) == (2, 2)


async def test_failure_after_first_token_is_not_retried(sims: list[tuple[str, Any]]) -> None:
    (one_url, one), (two_url, two), _ = sims
    config = ProviderConfig(name="pool-drop", base_urls=(one_url, two_url), max_retries=0)
    before = one.stats.requests + two.stats.requests
    with pytest.raises(LLMError) as err:
        await collect(config, model="sim+drop@3")
    assert err.value.kind == "dropped"
    assert one.stats.requests + two.stats.requests - before == 1


# --- retries --------------------------------------------------------------------------


async def test_rate_limit_is_retried_after_retry_after(sims: list[tuple[str, Any]]) -> None:
    url, app = sims[0]
    config = ProviderConfig(name="retry", base_urls=(url,), max_retries=1)
    before = app.stats.requests
    started = time.monotonic()
    with pytest.raises(LLMError) as err:
        await collect(config, model="sim+429")
    assert err.value.kind == "rate_limited"
    assert app.stats.requests - before == 2  # the first try and one retry
    assert time.monotonic() - started >= 0.9  # the retry waited for Retry-After: 1


async def test_exhausted_quota_is_final(sims: list[tuple[str, Any]]) -> None:
    url, app = sims[0]
    config = ProviderConfig(name="quota", base_urls=(url, sims[1][0]), max_retries=2)
    before = app.stats.requests + sims[1][1].stats.requests
    with pytest.raises(LLMError) as err:
        await collect(config, model="sim+quota")
    assert err.value.kind == "quota"
    assert app.stats.requests + sims[1][1].stats.requests - before == 1  # no retry, no failover


# --- the queue at the concurrency cap -----------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("memory_layer", "replies_idle")
async def test_replies_beyond_the_cap_queue_in_order_and_show_it(world: World) -> None:
    world.provider.max_concurrency = 1
    await database_sync_to_async(world.provider.save)()
    c = await database_sync_to_async(make_assistant)(world.provider, "c")
    await database_sync_to_async(world.room.assistants.add)(c)
    async with member(world.alice) as alice:
        await alice.post("@a @b @c one at a time")
        await alice.until(lambda f: all_final(f, 3))
    queued = [frame for frame in alice.raw if 'class="state"' in frame and "queued" in frame]
    assert len(queued) == 2  # @b and @c waited
    replies = sorted((r for r in alice.frames.replies.values() if r.role == "assistant"), key=lambda r: r.seq)
    for earlier, later in itertools.pairwise(replies):
        assert earlier.ended_at is not None and later.first_piece_at is not None
        assert later.first_piece_at >= earlier.piece_times[-1][1]  # started after the previous one streamed
    stored = await database_sync_to_async(list)(Message.objects.filter(role="assistant"))
    assert all(m.status == "done" for m in stored)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("layer", "replies_idle")
async def test_the_deployment_wide_cap_queues_first_come_first_served(
    world: World, sim: tuple[str, SimulatorApp]
) -> None:
    """`deployment_max_concurrency` is kept in the shared state (Redis, or this process
    alone): with no per-process cap, the cap of 1 still sends the model one request at a
    time, and the waiting reply shows it is queued."""
    world.provider.deployment_max_concurrency = 1
    await database_sync_to_async(world.provider.save)()
    sim[1].stats.peak_active = 0
    async with member(world.alice) as alice:
        await alice.post("@a @b one at a time, across the deployment")
        await alice.until(lambda f: all_final(f, 2))
    assert sum(1 for frame in alice.raw if 'class="state"' in frame and "queued" in frame) == 1
    assert sim[1].stats.peak_active == 1
    stored = await database_sync_to_async(list)(Message.objects.filter(role="assistant"))
    assert [m.status for m in stored] == ["done", "done"]


# --- cost -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("memory_layer", "replies_idle")
async def test_reply_cost_from_prices_and_usage(world: World) -> None:
    world.provider.price_input_per_m = Decimal("2.5")
    world.provider.price_output_per_m = Decimal("10")
    await database_sync_to_async(world.provider.save)()
    async with member(world.alice) as alice:
        await alice.post("@a what does it cost?")
        await alice.until(lambda f: all_final(f, 1))
    reply = await database_sync_to_async(Message.objects.get)(role="assistant")
    assert reply.prompt_tokens and reply.tokens
    expected = (Decimal("2.5") * reply.prompt_tokens + Decimal(10) * reply.tokens) / 1_000_000
    assert reply.cost == expected.quantize(Decimal("0.000001"))
    final = next(r for r in alice.frames.replies.values() if r.role == "assistant")
    assert Decimal(final.final_attrs["data-cost"]) == reply.cost


# --- providers from the environment ------------------------------------------------------------


@pytest.mark.django_db
def test_providers_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLLAB_PROVIDERS", "groq, local-gpu")
    monkeypatch.setenv("COLLAB_PROVIDER_GROQ_BASE_URL", "https://api.groq.com/openai/v1")
    monkeypatch.setenv("COLLAB_PROVIDER_GROQ_MODEL", "llama-3.1-8b-instant")
    monkeypatch.setenv("COLLAB_PROVIDER_GROQ_PRICE_OUTPUT", "0.08")
    monkeypatch.setenv("COLLAB_PROVIDER_GROQ_MAX_CONCURRENCY", "4")
    monkeypatch.setenv("COLLAB_PROVIDER_LOCAL_GPU_BASE_URL", "http://10.0.0.5:8000/v1, http://10.0.0.6:8000/v1")
    monkeypatch.setenv("COLLAB_PROVIDER_LOCAL_GPU_MODEL", "qwen")
    monkeypatch.setenv("COLLAB_PROVIDER_LOCAL_GPU_API_KEY_ENV", "")
    providers.ensure_default_assistant()
    groq = Provider.objects.get(name="groq")
    assert groq.api_key_env == "GROQ_API_KEY" and groq.max_concurrency == 4
    assert groq.price_output_per_m == Decimal("0.08") and groq.assistants.get().handle == "groq"
    gpu = Provider.objects.get(name="local-gpu")
    assert gpu.base_urls == ["http://10.0.0.5:8000/v1", "http://10.0.0.6:8000/v1"] and gpu.api_key_env == ""


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"COLLAB_PROVIDERS": "x", "COLLAB_PROVIDER_X_MODEL": "m"}, "COLLAB_PROVIDER_X_BASE_URL"),
        (
            {"COLLAB_PROVIDERS": "x", "COLLAB_PROVIDER_X_MODEL": "m", "COLLAB_PROVIDER_X_BASE_URL": "http://h/v1",
             "COLLAB_PROVIDER_X_PRICE_INPUT": "cheap"},
            "COLLAB_PROVIDER_X_PRICE_INPUT must be a number",
        ),
        ({"COLLAB_PROVIDERS": "bad name!"}, "not a valid provider name"),
    ],
)  # fmt: skip
def test_bad_provider_environment_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ImproperlyConfigured, match=message):
        providers.env_providers()


# --- keys ----------------------------------------------------------------------------------------

SECRET = "sk-test-THIS-MUST-NEVER-LEAK-0123456789"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("memory_layer", "replies_idle")
async def test_api_key_never_appears_in_logs_pages_or_database(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("COLLAB_KEY_TEST_SECRET", SECRET)
    caplog.set_level(logging.DEBUG)  # the SDK and HTTP client at their most talkative
    with running_simulator_app(tps=400, ttft_ms=5, reply_tokens=20, api_key=SECRET) as (url, _app):
        keyed = await database_sync_to_async(Provider.objects.create)(
            name="keyed", base_url=url, default_model="sim", api_key_env="COLLAB_KEY_TEST_SECRET", max_retries=0
        )
        wrong = await database_sync_to_async(Provider.objects.create)(
            name="wrong", base_url=url, default_model="sim", api_key_env="COLLAB_KEY_TEST_WRONG", max_retries=0
        )
        monkeypatch.setenv("COLLAB_KEY_TEST_WRONG", SECRET + "-wrong")
        for provider, handle in ((keyed, "keyed"), (wrong, "wrong")):
            a = await database_sync_to_async(make_assistant)(provider, handle)
            await database_sync_to_async(world.room.assistants.add)(a)
        async with member(world.alice) as alice:
            await alice.post("@keyed @wrong hi")
            await alice.until(lambda f: all_final(f, 2))
    by_name = {m.author_name: m for m in await database_sync_to_async(list)(Message.objects.all())}
    assert by_name["KEYED"].status == "done"  # the key was sent, and it worked
    assert by_name["WRONG"].status == "failed" and "refused the key" in by_name["WRONG"].error

    def pages_and_dump() -> str:
        from django.contrib.auth.models import User

        admin = User.objects.create_superuser("root", password="root-pw-123")
        client = Client()
        client.force_login(admin)
        out = StringIO()
        call_command("dumpdata", stdout=out)
        pages = [
            client.get(f"/admin/chat/provider/{keyed.pk}/change/").content.decode(),
            client.get("/admin/chat/provider/").content.decode(),
            client.get("/admin/chat/message/").content.decode(),
            client.get("/r/lab/").content.decode(),
        ]
        return out.getvalue() + "".join(pages)

    everything = await database_sync_to_async(pages_and_dump)()
    assert "COLLAB_KEY_TEST_SECRET" in everything  # the variable's name is shown ...
    leaks = [r.getMessage() for r in caplog.records if SECRET in r.getMessage()]
    assert leaks == []
    assert SECRET not in everything  # ... its value never
    assert SECRET not in "".join(alice.raw)


# --- the provider benchmark -------------------------------------------------------------------


@pytest.mark.django_db
def test_benchmark_provider_command(sims: list[tuple[str, Any]], tmp_path: Any) -> None:
    import json

    Provider.objects.create(
        name="bench",
        base_url=sims[0][0],
        default_model="sim",
        price_input_per_m=Decimal(1),
        price_output_per_m=Decimal(4),
    )
    out = StringIO()
    call_command(
        "benchmark_provider",
        "bench",
        "--runs",
        "2",
        "--max-tokens",
        "15",
        "--json",
        str(tmp_path / "b.json"),
        stdout=out,
    )
    table = out.getvalue()
    assert all(name in table for name in ("code", "summary", "reasoning"))
    data = json.loads((tmp_path / "b.json").read_text())
    for scenario in data["scenarios"].values():
        assert len(scenario["runs"]) == 2 and scenario["failures"] == []
        assert scenario["output_tokens"]["median"] == 15  # the simulator's usage: max_tokens honoured
        assert scenario["ttft_ms"]["min"] > 0 and scenario["tokens_per_s"]["median"] > 0
        run = scenario["runs"][0]
        assert Decimal(run["cost"]) == (Decimal(run["prompt_tokens"]) + 4 * Decimal(run["output_tokens"])) / 1_000_000


@pytest.mark.django_db
def test_benchmark_provider_errors(sims: list[tuple[str, Any]]) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no provider named 'missing'"):
        call_command("benchmark_provider", "missing")
    Provider.objects.create(name="broken", base_url=sims[2][0], default_model="sim", max_retries=0)
    with pytest.raises(CommandError, match="every run failed"):
        call_command("benchmark_provider", "broken", "--runs", "1", stdout=StringIO())


@pytest.mark.django_db
def test_benchmark_admin_action(sims: list[tuple[str, Any]], admin_client: Client) -> None:
    provider = Provider.objects.create(name="bench", base_url=sims[0][0], default_model="sim")
    response = admin_client.post(
        "/admin/chat/provider/", {"action": "benchmark", "_selected_action": [provider.pk]}, follow=True
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "bench" in page and "reasoning" in page and "TTFT ms" in page
