"""The simulated model's per-request directives (collab/simulator/directives.py): `{{hold}}`
streams long and slowly until its client leaves, `{{fault SPEC}}` fails that request alone;
both only from the request's last user message. Over a real loopback port, the real
`openai.AsyncOpenAI` client."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from collab.simulator.directives import HOLD_TOKENS, HOLD_TPS, shape_of
from collab.simulator.testing import running_simulator_app
from collab.simulator.text import simulated_tokens


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_only_the_last_user_message_is_read() -> None:
    assert shape_of([user("{{hold}} go")]).hold
    assert not shape_of([user("{{hold}} go"), {"role": "assistant", "content": "so far"}, user("a note")]).hold
    assert shape_of([user("x"), {"role": "assistant", "content": "{{hold}}"}]) == shape_of([user("x")])
    fault = shape_of([user("in French {{fault drop@3}}")]).fault
    assert fault is not None and (fault.fault, fault.fault_after) == ("drop", 3)
    with pytest.raises(ValueError):
        shape_of([user("{{fault slow}}")])  # names no fault
    with pytest.raises(ValueError):
        shape_of([user("{{fault nonsense}}")])


async def test_hold_streams_slowly_until_the_client_leaves_and_fault_fails_one_request() -> None:
    with running_simulator_app(tps=1000.0, ttft_ms=0, reply_tokens=10, seed=3) as (url, app):
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
        messages: list[Any] = [user("{{hold}} tell me")]
        raw = await client.chat.completions.with_raw_response.create(model="sim", messages=messages, stream=True)
        assert raw.headers["x-sim-tokens"] == str(HOLD_TOKENS) and float(raw.headers["x-sim-tps"]) == HOLD_TPS
        got = ""
        async for chunk in raw.parse():
            got += (chunk.choices[0].delta.content or "") if chunk.choices else ""
            if len(got.split()) >= 3:
                break
        await raw.parse().close()
        assert "".join(simulated_tokens(messages, 3, "sim", HOLD_TOKENS)).startswith(got)
        # The same conversation, steered: its last user message holds nothing: a usual reply.
        after = [*messages, {"role": "assistant", "content": got}, user("shorter")]
        whole = await client.chat.completions.create(model="sim", messages=after)
        assert whole.choices[0].message.content == "".join(simulated_tokens(after, 3, "sim", 10))
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="sim", messages=[user("{{fault quota}} no")])
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="sim", messages=[user("{{fault nonsense}} no")])
        await client.close()
        assert app.stats.disconnects == 1  # the held stream ended with its client (three requests ago)
