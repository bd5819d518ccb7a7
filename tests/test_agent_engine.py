"""The agent's run engine (chat/agent.py) alone, driven by a scripted model stream: what
a provider may send that the simulated model never does (it honours tool_choice), and
the check's verdict as real models phrase it. The run over real sockets and the real
client is tests/test_agents.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from collab.chat.agent import MAX_CALLS_PER_STEP, AgentPlan, AgentRun, verdict_of
from collab.llm import ToolCall, Usage


class ScriptedTools:
    def __init__(self) -> None:
        self.called: list[str] = []

    def schemas(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]

    def timeout_for(self, name: str) -> float:
        return 1.0

    async def call(self, name: str, arguments: str) -> str:
        self.called.append(arguments)
        return "12:00"


def run_of(replies: list[list[Any]], steps: int = 8) -> tuple[AgentRun, list[str], list[str], list[list[Any]]]:
    """A run whose model answers each call with the next of `replies`; also what it logged,
    answered, and the requests it made."""
    log: list[str] = []
    answer: list[str] = []
    requests: list[list[Any]] = []

    def call_model(messages: list[Any], tools: Any, max_tokens: Any, choice: Any) -> AsyncIterator[Any]:
        requests.append([messages, tools, choice])
        items = replies[len(requests) - 1]

        async def stream() -> AsyncIterator[list[Any]]:  # a read per item, as a slow stream comes
            for item in items:
                yield [item]
            yield [Usage(10, len(items))]

        return stream()

    async def state(_label: str) -> None:
        return None

    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "alice: go"}]
    run = AgentRun(AgentPlan(steps, 20000, ScriptedTools()), messages, call_model, answer.append, log.append, state)  # type: ignore[arg-type]
    return run, log, answer, requests


def call(i: int, arguments: str = "{}") -> ToolCall:
    return ToolCall(f"c{i}", "now", arguments)


@pytest.mark.parametrize(
    ("said", "verdict"),
    [
        ("ON PLAN: fine", "ON PLAN"),
        ("**REPLAN** it failed", "REPLAN"),
        ("Verdict: on-plan, good", "ON PLAN"),
        ("`RE-PLAN`", "REPLAN"),
        ("NOT ON PLAN: wrong tool", "REPLAN"),
        ("I think we should REPLAN", None),  # not at its start: no verdict
        ("", None),
    ],
)
def test_the_checks_verdict_is_read_from_its_start(said: str, verdict: str | None) -> None:
    assert verdict_of(said) == verdict


async def test_calls_past_the_cap_are_answered_not_run() -> None:
    many = [call(i) for i in range(MAX_CALLS_PER_STEP + 2)]
    run, log, answer, requests = run_of([["a plan"], many, ["ON PLAN: ok"], ["the answer"]])
    await run.go()
    assert len(run.plan.tools.called) == MAX_CALLS_PER_STEP  # type: ignore[attr-defined]
    shown = "".join(log)
    assert shown.count("✗ now: not run: at most 8 tool calls a step") == 2
    tool_turns = [m for m in requests[2][0] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_turns] == [c.id for c in many]  # every call answered
    assert answer == ["the answer"]


async def test_a_provider_that_ignores_tool_choice_none_at_the_last_call() -> None:
    """The forced answer comes back as calls and no text: the run ends with its note."""
    run, log, answer, requests = run_of([["a plan"], [call(1)], [call(2)]], steps=3)
    await run.go()
    assert requests[2][2] == "none"
    shown = "".join(log)
    assert "(calls not run: now)" in shown and "■ Stopped at its step budget (3 model calls)" in shown
    assert run.finish_reason == "budget.steps" and "stopped at its step budget" in "".join(answer)


async def test_bad_arguments_go_back_as_an_object_and_repeated_ids_apart() -> None:
    run, _log, _answer, requests = run_of(
        [["plan"], [ToolCall("x", "now", '{"a": '), ToolCall("x", "now", "[1]")], ["ON PLAN"], ["done"]]
    )
    await run.go()
    assistant = next(m for m in requests[2][0] if m.get("tool_calls"))
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == ["{}", "{}"]
    assert [c["id"] for c in assistant["tool_calls"]] == ["x", "x_1"]
    assert [m["tool_call_id"] for m in requests[2][0] if m["role"] == "tool"] == ["x", "x_1"]


async def test_the_plan_is_in_the_requests_turn_never_the_system_message() -> None:
    run, _log, _answer, requests = run_of([["step one: look"], ["the answer"]])
    await run.go()
    system, *rest = requests[1][0]
    assert "step one" not in system["content"]
    assert rest[-1]["role"] == "user" and "your own notes" in rest[-1]["content"] and "step one" in rest[-1]["content"]
