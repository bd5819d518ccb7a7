"""Agents across processes (issue 13, "Stop works at any step, from any process"): an
agent run started by a member on one Daphne process streams its log live to members on
the other one, a socket that joins there mid-run resumes it gap-free, and the asker
stops it from the other process mid-run: it ends `stopped` everywhere, the model's
stream is closed, and what was done is stored (two real Daphnes, one Redis, one
PostgreSQL: tests/cluster.py; the run's log lines: docs/architecture.md#a-agents)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from collab.loadtest.wire import thinking_shown
from collab.simulator.app import SimulatorApp
from tests import test_multiprocess
from tests.cluster import Cluster, Tab
from tests.test_agents import STATE
from tests.test_multiprocess import opened
from tests.test_reasoning import thinking_seen

# The two-process fixtures of tests/test_multiprocess.py (a simulated model at 150
# tokens/s writing up to 3,000 tokens, a cluster, alice and bob).
sim, cluster, two = test_multiprocess.sim, test_multiprocess.cluster, test_multiprocess.two

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(180)]

# At 150 tokens/s the plan (500 tokens at most, agent.PLAN_TOKENS) takes 3.3 s and the
# final step (3,000 tokens) 20 s: the run is still going while the test acts on it.
PLANNER = """
from collab.chat.models import Assistant, Room
room = Room.objects.get(slug="lab")
provider = room.assistants.get(handle="long").provider
room.assistants.add(Assistant.objects.create(
    handle="planner", display_name="PLANNER", provider=provider, model="sim", max_tokens=4000, is_agent=True,
    available_to="everyone"))
"""
STORED = (
    "import json; from collab.chat.models import Message; print(json.dumps({m.id: [m.reasoning, m.text, "
    "m.status, m.agent_steps] for m in Message.objects.filter(role='assistant')}))"
)
QUESTION = '@planner what is 6*7? {{tool calculate {"expression": "6*7"}}}'


def the_reply_id(tab: Tab) -> int:
    (reply_id,) = tab.assistant_replies()
    return int(reply_id)


def log_of(tab: Tab, reply_id: int) -> str:
    return thinking_seen(tab, reply_id)[0]  # type: ignore[arg-type]  # a Tab has the raw frames a Member has


def stopped(reply_id: int) -> Any:
    return lambda t: (
        reply_id in t.frames.replies and t.frames.replies[reply_id].final_attrs.get("data-status") == "stopped"
    )


def in_the_final_step(reply_id: int) -> Any:
    """The last model call (the answer, 20 s) is streaming: words shown after its heading."""
    return lambda t: len(log_of(t, reply_id).partition("✓")[0].partition("▸ Step 4\n")[2]) >= 20


async def test_an_agent_run_on_one_process_is_watched_and_stopped_from_the_other(
    two: tuple[Cluster, Any, Any], sim: tuple[str, SimulatorApp]
) -> None:
    processes, alice, bob = two
    processes.manage("shell", "-c", PLANNER)
    p1, p2 = processes.processes
    app = sim[1]
    async with alice.open(p1) as a_ws, bob.open(p2) as b_ws:
        a, b = await opened(a_ws, b_ws)
        await a.post(QUESTION)  # the run goes on P1
        await b.until(lambda t: len(t.assistant_replies()) == 1)
        reply_id = the_reply_id(b)
        await b.until(lambda t: len(thinking_seen(t, reply_id)[1]) >= 3)  # type: ignore[arg-type]
        assert "→" not in log_of(b, reply_id)  # still planning: the pieces are live on P2
        async with alice.open(p2) as late_ws:  # alice's second tab, on P2, joins mid-run
            (late,) = await opened(late_ws)
            shown = thinking_shown(late.raw[0])
            assert shown and shown[0].msg == reply_id
            at_connect = shown[0].length
            # The log so far, from the shared state, on the other process:
            assert at_connect is not None and at_connect > 0
            await late.until(lambda t: "→ calculate(" in log_of(t, reply_id))
            await late.until(in_the_final_step(reply_id))
            disconnects = app.stats.disconnects
            await late.send(action="stop", message_id=reply_id)  # asked on P2, the run is on P1
            for tab in (late, a, b):
                await tab.until(stopped(reply_id))
            assert not late.frames.errors
    [reasoning, _text, status, steps] = json.loads(processes.manage("shell", "-c", STORED).splitlines()[-1])[
        str(reply_id)
    ]
    assert status == "stopped" and steps == 4  # plan, the step that called, its check, the answer cut short
    assert '→ calculate({"expression": "6*7"})\n← calculate: 42\n' in reasoning
    assert "✓ Final answer" not in reasoning
    for tab in (a, b, late):
        log, pieces = thinking_seen(tab, reply_id)  # type: ignore[arg-type]
        assert pieces and reasoning.startswith(log)  # live, gap-free, and kept as it was shown
        assert "▸ Step 4\n" in log
        assert tab.frames.replies[reply_id].final_attrs["data-steps"] == "4"
        labels = [s.group(2) for f in tab.raw for s in STATE.finditer(f) if int(s.group(1)) == reply_id]
        assert any(label.startswith("step 4 of 8 ·") for label in labels)  # the budget, live on each
    assert thinking_seen(late, reply_id)[1][0][0] == at_connect  # type: ignore[arg-type]  # resumed at its snapshot's end
    assert app.stats.disconnects > disconnects  # the model's stream was closed, not left running
