"""Thinking across processes (issue 11, part 3): a reasoning reply run by one Daphne
process streams its thinking apart to a member on the other one, who joins mid-thinking
and resumes it gap-free; it ends cut off at max_tokens, said so on both (two real
Daphnes, one Redis, one PostgreSQL: tests/cluster.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from collab.loadtest.wire import thinking_shown
from tests import test_multiprocess
from tests.cluster import Cluster, Tab
from tests.test_multiprocess import opened
from tests.test_reasoning import thinking_seen

# The two-process fixtures of tests/test_multiprocess.py (a simulated model, a cluster, alice and bob).
sim, cluster, two = test_multiprocess.sim, test_multiprocess.cluster, test_multiprocess.two

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(180)]

# 1,500 thinking tokens at 150 tokens/s (10 s), then the answer, cut at 1,600 tokens in all.
THINKER = """
from collab.chat.models import Assistant, Room
room = Room.objects.get(slug="lab")
provider = room.assistants.get(handle="long").provider
room.assistants.add(Assistant.objects.create(
    handle="thinker", display_name="THINKER", provider=provider, model="sim+think@1500", max_tokens=1600,
    available_to="everyone"))
"""
STORED = (
    "import json; from collab.chat.models import Message; print(json.dumps({m.id: [m.reasoning, m.text, "
    "m.finish_reason, m.tokens] for m in Message.objects.filter(role='assistant')}))"
)


def the_reply_id(tab: Tab) -> int:
    (reply_id,) = tab.assistant_replies()
    return int(reply_id)


async def test_thinking_reaches_the_other_process_and_resumes_there(two: tuple[Cluster, Any, Any]) -> None:
    processes, alice, bob = two
    processes.manage("shell", "-c", THINKER)
    p1, p2 = processes.processes
    async with alice.open(p1) as a_ws:
        (a,) = await opened(a_ws)
        await a.post("@thinker think it through")
        await a.until(lambda t: len(t.assistant_replies()) == 1)
        reply_id = the_reply_id(a)
        await a.until(lambda t: len(thinking_seen(t, reply_id)[1]) >= 3)
        async with bob.open(p2) as b_ws:
            (b,) = await opened(b_ws)
            shown = thinking_shown(b.raw[0])
            assert shown and shown[0].msg == reply_id
            at_connect = shown[0].length
            # The thinking so far, from the shared state, on the other process:
            assert at_connect is not None and at_connect > 0
            done = lambda t: t.frames.replies[reply_id].final_attrs.get("data-status") == "done"  # noqa: E731
            await b.until(done, timeout=60)
            await a.until(done, timeout=60)
    [reasoning, text, finish_reason, tokens] = json.loads(processes.manage("shell", "-c", STORED).splitlines()[-1])[
        str(reply_id)
    ]
    assert finish_reason == "length" and tokens == 1600 and reasoning and text
    for tab in (a, b):
        seen, pieces = thinking_seen(tab, reply_id)
        assert seen == reasoning and pieces  # live pieces, none lost, none twice
        assert tab.frames.replies[reply_id].final_attrs["data-finish"] == "length"
        assert reasoning[:40] not in tab.frames.replies[reply_id].final_html  # the answer's body: no thinking
    assert thinking_seen(b, reply_id)[1][0][0] == at_connect  # resumed where its snapshot ended
