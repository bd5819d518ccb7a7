"""Provider faults before and after the first token: the reply ends `failed` with its
partial text and a reason, the consumer goes on, and other replies are unaffected."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.core.exceptions import ValidationError

from collab.chat.models import Assistant, Message, Provider
from tests.conftest import World, all_final, make_assistant, member, reply_ids
from tests.servers import free_port

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("memory_layer", "replies_idle"),
]


async def assistant_on(world: World, handle: str, model: str = "sim", **provider: object) -> Assistant:
    """A new provider (defaults: the simulator) and an assistant on it, in the room."""

    def make() -> Assistant:
        fields = {"name": handle, "base_url": world.provider.base_url, "default_model": "sim", **provider}
        assistant = make_assistant(Provider.objects.create(**fields), handle, model=model)
        world.room.assistants.add(assistant)
        return assistant

    return await database_sync_to_async(make)()


@pytest.mark.parametrize(
    ("model", "reason_part", "partial"),
    [
        ("sim+500", "provider failed", False),
        ("sim+429", "rate limiting", False),
        ("sim+quota", "quota", False),
        ("sim+drop@7", "broke mid-reply", True),
        ("sim+stall@7", "stopped sending", True),
    ],
)
async def test_fault_fails_the_reply_and_the_other_goes_on(
    world: World, model: str, reason_part: str, partial: bool
) -> None:
    # No SDK retries here, so a 429 or 500 surfaces at once; retry behaviour is the SDK's.
    await assistant_on(world, "bad", model, read_timeout_s=0.5, max_retries=0)
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.post("@a @bad hello")
        for m in (alice, bob):
            await m.until(lambda f: all_final(f, 2))
        await alice.post("still alive?")
        await alice.until(lambda f: len(reply_ids(f, "user")) == 2)
    stored = {x.author_name: x for x in await database_sync_to_async(list)(Message.objects.filter(role="assistant"))}
    bad, good = stored["BAD"], stored["A"]
    assert good.status == "done" and good.text
    assert bad.status == "failed"
    assert reason_part in bad.error
    assert bool(bad.text) == partial
    final = alice.frames.replies[bad.id]
    assert final.final_attrs["data-status"] == "failed"
    assert final.text == bad.text  # the pieces shown equal the partial text kept
    assert reason_part in final.final_html or any(reason_part in r for r in alice.raw if f'id="msg-{bad.id}"' in r)


async def test_unreachable_provider_fails_before_first_token(world: World) -> None:
    await assistant_on(world, "gone", base_url=f"http://127.0.0.1:{free_port()}/v1", connect_timeout_s=1)
    async with member(world.alice) as alice:
        await alice.post("@gone are you there?")
        await alice.until(lambda f: all_final(f, 1))
    reply = await database_sync_to_async(Message.objects.get)(role="assistant")
    assert reply.status == "failed" and reply.text == ""
    assert "could not reach" in reply.error


async def test_slow_first_token_times_out(world: World) -> None:
    # read timeout 0.2 s against a stream that stalls before its first token
    await assistant_on(world, "late", "sim+stall@0", read_timeout_s=0.2)
    async with member(world.alice) as alice:
        await alice.post("@late hi")
        await alice.until(lambda f: all_final(f, 1))
    reply = await database_sync_to_async(Message.objects.get)(role="assistant")
    assert reply.status == "failed" and reply.text == ""
    assert reply.error


async def test_total_timeout(world: World) -> None:
    await assistant_on(world, "slowpoke", "sim+stall@3", read_timeout_s=30, total_timeout_s=1)
    async with member(world.alice) as alice:
        await alice.post("@slowpoke hi")
        await alice.until(lambda f: all_final(f, 1))
    reply = await database_sync_to_async(Message.objects.get)(role="assistant")
    assert reply.status == "failed"
    assert "longer than 1 s" in reply.error
    assert reply.text  # the three tokens before the stall are kept


async def test_missing_api_key_variable_is_a_clear_failure(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLLAB_KEY_TEST_ABSENT", raising=False)
    await assistant_on(world, "keyed", api_key_env="COLLAB_KEY_TEST_ABSENT")
    async with member(world.alice) as alice:
        await alice.post("@keyed hi")
        await alice.until(lambda f: all_final(f, 1))
    reply = await database_sync_to_async(Message.objects.get)(role="assistant")
    assert reply.status == "failed"
    assert "COLLAB_KEY_TEST_ABSENT is not set" in reply.error


async def test_a_key_variable_the_operator_did_not_allow_is_never_read(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider saved around the admin's check (an old row, say) pointing at Django's
    secret key fails with a clear error; the secret never leaves the process."""
    monkeypatch.setenv("DJANGO_SECRET_KEY", "the-real-secret")
    await assistant_on(world, "sneaky", api_key_env="DJANGO_SECRET_KEY")
    async with member(world.alice) as alice:
        await alice.post("@sneaky hi")
        await alice.until(lambda f: all_final(f, 1))
    reply = await database_sync_to_async(Message.objects.get)(role="assistant")
    assert reply.status == "failed"
    assert "DJANGO_SECRET_KEY is not an allowed key variable" in reply.error
    with pytest.raises(ValidationError) as refused:
        await database_sync_to_async(
            Provider(name="x", base_url="http://h/v1", api_key_env="DJANGO_SECRET_KEY").clean
        )()
    assert "api_key_env" in refused.value.message_dict
    for allowed in ("COLLAB_KEY_GROQ", "OPENAI_API_KEY", ""):
        await database_sync_to_async(Provider(name="y", base_url="http://h/v1", api_key_env=allowed).clean)()
