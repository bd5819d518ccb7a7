"""Function calling through the model client: the real openai client path (`stream_chat`)
against the real simulated model scripted with `{{tool ...}}` directives
(collab/simulator/README.md, "Tool calls (agents)"), and the providers' streaming
dialects of `tool_calls` byte for byte through a fake SSE server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest

from collab.llm import Endpoint, Finish, Item, LLMError, Thought, ToolCall, Usage, stream_chat
from collab.llm.client import ChatMessage, aclose_clients
from collab.simulator.app import SimulatorApp
from collab.simulator.testing import running_simulator_app
from collab.simulator.text import expected_text
from collab.simulator.tools import parse_directives, script_for
from tests.test_llm_client import serve

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {"type": "object", "properties": {}},
        },
    }
    for name in ("search_room", "calculate", "current_time")
]
SEED = 3
REPLY_TOKENS = 30


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[str, SimulatorApp]]:
    with running_simulator_app(tps=2000, ttft_ms=0, reply_tokens=REPLY_TOKENS, seed=SEED) as running:
        yield running


@pytest.fixture(autouse=True)
async def cleanup() -> AsyncIterator[None]:
    yield
    await aclose_clients()


async def ask(
    url: str, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = TOOLS, model: str = "sim", **kw: Any
) -> list[Item]:
    endpoint = Endpoint(url, max_retries=0)
    return [item async for read in stream_chat(endpoint, model, messages, tools=tools, **kw) for item in read]


def user(text: str) -> ChatMessage:
    return {"role": "user", "content": text}


def calls_of(items: list[Item]) -> list[ToolCall]:
    return [i for i in items if isinstance(i, ToolCall)]


def text_of(items: list[Item]) -> str:
    return "".join(i for i in items if isinstance(i, str))


def answered(calls: list[ToolCall], results: list[str]) -> list[ChatMessage]:
    """What an agent appends after running a round's calls."""
    turn: ChatMessage = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ],
    }
    return [turn, *({"role": "tool", "tool_call_id": c.id, "content": r} for c, r in zip(calls, results, strict=True))]


# ------------------------------------------------------------ the simulated model, scripted


async def test_one_tool_call(sim: tuple[str, SimulatorApp]) -> None:
    url, app = sim
    items = await ask(url, [user('Look it up. {{tool search_room {"query": "budget", "room": "ops"}}}')])
    assert calls_of(items) == [ToolCall("call_0_0", "search_room", '{"query": "budget", "room": "ops"}')]
    assert text_of(items) == ""
    assert not any(isinstance(i, Finish) for i in items)  # "tool_calls" is a normal end
    assert isinstance(items[-1], Usage)
    assert items.index(calls_of(items)[0]) < items.index(items[-1])  # calls before the usage
    # Usage counts the streamed pieces: the call's header and each argument fragment.
    script = script_for(app.recorded[-1]["messages"], TOOLS, SEED, "sim")
    assert script is not None and items[-1].completion_tokens == len(script.pieces) > 3
    assert app.recorded[-1]["tools"] == TOOLS  # the client sent the schemas


async def test_parallel_calls_then_text(sim: tuple[str, SimulatorApp]) -> None:
    url, _ = sim
    messages = [user('Both: {{tool calculate {"expression": "6*7"}}} and {{tool current_time}}')]
    calls = calls_of(await ask(url, messages))
    assert calls == [
        ToolCall("call_0_0", "calculate", '{"expression": "6*7"}'),
        ToolCall("call_0_1", "current_time", "{}"),
    ]
    messages += answered(calls, ["42", "2026-12-03T13:00:00Z"])
    items = await ask(url, messages)
    assert calls_of(items) == []
    assert text_of(items) == expected_text(messages, SEED, "sim", REPLY_TOKENS)


async def test_two_rounds(sim: tuple[str, SimulatorApp]) -> None:
    url, _ = sim
    messages = [
        {"role": "system", "content": "You are an agent."},
        user('{{tool search_room {"query": "rent"}}} {{next}} {{tool calculate {"expression": "1200*12"}}}'),
    ]
    first = calls_of(await ask(url, messages))
    assert first == [ToolCall("call_0_0", "search_room", '{"query": "rent"}')]
    messages += [{"role": "assistant", "content": "Plan:\n1. look"}, *answered(first, ["rent is 1200"])]
    second = calls_of(await ask(url, messages))
    assert second == [ToolCall("call_1_0", "calculate", '{"expression": "1200*12"}')]
    messages += answered(second, ["14400"])
    final = await ask(url, messages)
    assert calls_of(final) == [] and text_of(final) == expected_text(messages, SEED, "sim", REPLY_TOKENS)


async def test_bad_json_arguments_are_passed_verbatim(sim: tuple[str, SimulatorApp]) -> None:
    url, _ = sim
    items = await ask(url, [user('{{tool calculate {"expression": "1+}}')])
    assert calls_of(items) == [ToolCall("call_0_0", "calculate", '{"expression": "1+')]


async def test_without_directives_or_without_tools_the_text_is_plain(sim: tuple[str, SimulatorApp]) -> None:
    url, _ = sim
    plain = [user("What is the capital of France?")]
    items = await ask(url, plain)
    assert calls_of(items) == [] and text_of(items) == expected_text(plain, SEED, "sim", REPLY_TOKENS)
    scripted = [user('{{tool calculate {"expression": "2+2"}}}')]
    items = await ask(url, scripted, tools=None)
    assert calls_of(items) == [] and text_of(items) == expected_text(scripted, SEED, "sim", REPLY_TOKENS)


async def test_evaluation_on_plan_and_replan(sim: tuple[str, SimulatorApp]) -> None:
    url, _ = sim
    evaluate: ChatMessage = {"role": "system", "content": "Evaluate: does the last result serve the plan?"}
    task = user('{{tool search_room {"query": "x"}}}')
    on_plan = text_of(await ask(url, [task, evaluate], tools=None))
    assert on_plan.startswith("ON PLAN: ") and len(on_plan) > len("ON PLAN: ") + 10
    replan_task = user('{{replan}} {{tool search_room {"query": "x"}}}')
    replan = text_of(await ask(url, [replan_task, evaluate], tools=None))
    assert replan.startswith("REPLAN: ")
    revised: ChatMessage = {"role": "assistant", "content": "Revised plan:\n1. search again"}
    assert text_of(await ask(url, [replan_task, revised, evaluate], tools=None)).startswith("ON PLAN: ")
    # An "Evaluate" prompt sent as a user message is not the task: the directives stay read.
    assert text_of(await ask(url, [replan_task, user("Evaluate the last step.")], tools=None)).startswith("REPLAN")
    # Not the last message: no verdict.
    assert not text_of(await ask(url, [evaluate, task], tools=None)).startswith(("ON PLAN", "REPLAN"))


async def test_tool_round_cut_at_max_tokens(sim: tuple[str, SimulatorApp]) -> None:
    url, _ = sim
    items = await ask(url, [user('{{tool calculate {"expression": "12345 + 67890"}}}')], max_tokens=3)
    assert calls_of(items) == [ToolCall("call_0_0", "calculate", '{"expression')]
    assert items[-1] == Finish("length")


def test_not_streamed_reply_carries_tool_calls(sim: tuple[str, SimulatorApp]) -> None:
    url, _ = sim
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
    try:
        reply = client.chat.completions.create(
            model="sim",
            messages=[{"role": "user", "content": 'Go {{tool calculate {"expression": "2*3"}}} {{tool current_time}}'}],
            tools=TOOLS,  # type: ignore[arg-type]
        )
    finally:
        client.close()
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]  # type: ignore[union-attr]
    assert calls == [("call_0_0", "calculate", '{"expression": "2*3"}'), ("call_0_1", "current_time", "{}")]
    assert reply.usage is not None and reply.usage.completion_tokens > 4


def test_directive_syntax() -> None:
    directives = parse_directives(
        'a {{tool f {"a": {"b": [1, "}}"]}, "c": 2}}} b {{ next }} {{tool g not json}} {{replan}} {{tool h'
    )
    assert directives.rounds == ((("f", '{"a": {"b": [1, "}}"]}, "c": 2}'),), (("g", "not json"),))
    assert directives.replan  # and the unclosed `{{tool h` is no directive


# --------------------------------------------- providers' dialects, byte for byte (fake server)


def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def fragment(index: int | None, arguments: Any = None, **head: Any) -> dict[str, Any]:
    call: dict[str, Any] = {} if index is None else {"index": index}
    if "id" in head:
        call["id"] = head.pop("id")
        call["type"] = "function"
    function = dict(head)
    if arguments is not None:
        function["arguments"] = arguments
    call["function"] = function
    return {"tool_calls": [call]}


USAGE = b'data: {"id": "c", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7}}\n\n'
DONE = b"data: [DONE]\n\n"


async def run(events: list[bytes]) -> list[Item]:
    server, url = await serve(events)
    try:
        async with server:
            return await ask(url, [user("hi")])
    finally:
        server.close()


async def test_openai_fragmented_arguments() -> None:
    items = await run(
        [
            event({"role": "assistant", "content": None, **fragment(0, "", id="call_a", name="calculate")}),
            event(fragment(0, '{"expr')),
            event(fragment(0, 'ession": "1')),
            event(fragment(0, '+1"}')),
            event({}, "tool_calls"),
            USAGE,
            DONE,
        ]
    )
    assert items == [ToolCall("call_a", "calculate", '{"expression": "1+1"}'), Usage(9, 7)]


async def test_interleaved_parallel_calls() -> None:
    items = await run(
        [
            event({"content": "Let me check."}),
            event(fragment(0, "", id="a", name="search_room")),
            event(fragment(1, '{"expr', id="b", name="calculate")),
            event(fragment(0, '{"query":')),
            event(fragment(1, 'ession": "2"}')),
            event(fragment(0, ' "x"}')),
            event({}, "tool_calls"),
            DONE,
        ]
    )
    assert items == [
        "Let me check.",
        ToolCall("a", "search_room", '{"query": "x"}'),
        ToolCall("b", "calculate", '{"expression": "2"}'),
    ]


# Ollama (and some vLLM versions): each call whole in one delta, arguments maybe an object.
OLLAMA_CALLS = [
    {"id": "call_x", "index": 0, "type": "function",
     "function": {"name": "calculate", "arguments": {"expression": "3*3"}}},
    {"id": "call_y", "index": 1, "type": "function", "function": {"name": "current_time", "arguments": "{}"}},
]  # fmt: skip


async def test_ollama_whole_call_in_one_delta_and_arguments_as_object() -> None:
    items = await run(
        [
            event({"role": "assistant", "content": ""}),
            event({"role": "assistant", "content": "", "tool_calls": OLLAMA_CALLS}),
            event({"role": "assistant", "content": ""}, "tool_calls"),
            DONE,
        ]
    )
    assert items == [
        ToolCall("call_x", "calculate", '{"expression": "3*3"}'),
        ToolCall("call_y", "current_time", "{}"),
    ]


async def test_id_and_name_repeated_on_each_fragment() -> None:
    items = await run(
        [
            event(fragment(0, '{"a":', id="same", name="calculate")),
            event(fragment(0, " 1}", id="same", name="calculate")),
            event({}, "tool_calls"),
            DONE,
        ]
    )
    assert items == [ToolCall("same", "calculate", '{"a": 1}')]


async def test_calls_without_index() -> None:
    items = await run(
        [
            event(fragment(None, '{"q"', id="first", name="search_room")),
            event(fragment(None, ': "x"}')),  # no index, no id: continues the last call
            event(fragment(None, "{}", id="second", name="current_time")),
            event(fragment(None, "", id="first")),  # no index, a known id: that call
            event({}, "tool_calls"),
            DONE,
        ]
    )
    assert items == [ToolCall("first", "search_room", '{"q": "x"}'), ToolCall("second", "current_time", "{}")]


async def test_one_index_with_two_ids_is_two_calls_and_a_nameless_call_is_dropped() -> None:
    items = await run(
        [
            event(fragment(0, "{}", id="g1", name="current_time")),
            event(fragment(0, '{"expression": "1"}', id="g2", name="calculate")),
            event(fragment(1, "{}", id="nameless")),
            event({}, "tool_calls"),
            DONE,
        ]
    )
    assert items == [ToolCall("g1", "current_time", "{}"), ToolCall("g2", "calculate", '{"expression": "1"}')]


async def test_tool_calls_finish_without_done() -> None:
    items = await run([event(fragment(0, "{}", id="t", name="current_time")), event({}, "tool_calls"), USAGE])
    assert items == [ToolCall("t", "current_time", "{}"), Usage(9, 7)]


async def test_legacy_function_call() -> None:
    items = await run(
        [
            event({"function_call": {"name": "calculate", "arguments": '{"e"'}}),
            event({"function_call": {"arguments": ': "1"}'}}),
            event({}, "function_call"),
        ]
    )
    assert items == [ToolCall("call_0", "calculate", '{"e": "1"}')]


async def test_a_stream_cut_before_its_finish_yields_no_calls() -> None:
    with pytest.raises(LLMError) as err:
        await run([event(fragment(0, '{"a"', id="t", name="calculate")), DONE])
    assert err.value.kind == "dropped"


async def test_reasoning_model_thinks_then_calls(sim: tuple[str, SimulatorApp]) -> None:
    url, _ = sim
    items = await ask(url, [user("{{tool current_time}}")], model="sim+think@3")
    assert [type(i) for i in items] == [Thought, Thought, Thought, ToolCall, Usage]
    assert calls_of(items) == [ToolCall("call_0_0", "current_time", "{}")]


@pytest.mark.parametrize(
    "messages",
    [
        [user("hi"), {"role": "tool", "tool_call_id": "call_x", "content": "42"}],  # answers no call
        [
            user("hi"),
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "calculate", "arguments": "{}"}}]},
            user("and?"),  # the call was never answered
        ],
    ],
)  # fmt: skip
async def test_the_simulator_refuses_tool_turns_the_api_refuses(sim: tuple[str, SimulatorApp], messages: Any) -> None:
    """As OpenAI's API does (400): so that the agent tests catch a request a real provider
    would refuse."""
    with pytest.raises(LLMError) as refused:
        await ask(sim[0], messages)
    assert refused.value.kind == "bad_request" and "tool" in refused.value.message
