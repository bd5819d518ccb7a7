"""Agents (issue 13): a run of plan, tool calls, checks and a final answer, streamed to
real WebSocket clients as parts of one reply (the run's log on the thinking channel,
the answer on the text), with the simulated model scripted to call tools
(collab/simulator/README.md, "Tool calls"), over the real openai client."""

from __future__ import annotations

import re
from typing import Any

import pytest
from channels.db import database_sync_to_async

from collab.chat.models import Assistant, Membership, Message, Room
from collab.loadtest.wire import thinking_shown
from tests.conftest import Member, World, make_assistant, member, reply_ids
from tests.test_reasoning import finished, thinking_at_connect, thinking_seen

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("layer", "replies_idle")]

STATE = re.compile(r'<span id="msg-(\d+)-state"[^>]*>(.*?)</span>', re.S)


async def agent(world: World, handle: str = "planner", model: str = "sim", **fields: Any) -> Assistant:
    def create() -> Assistant:
        made = make_assistant(world.provider, handle, model=model, is_agent=True)
        for name, value in fields.items():
            setattr(made, name, value)
        made.save()
        world.room.assistants.add(made)
        return made

    return await database_sync_to_async(create)()


async def asked(m: Member, text: str) -> int:
    """Post `text`; the id of the one reply it starts, once announced."""
    before = set(reply_ids(m.frames))
    await m.post(text)
    await m.until(lambda f: len(set(reply_ids(f)) - before) == 1)
    [reply_id] = set(reply_ids(m.frames)) - before
    return reply_id


async def run_to_end(m: Member, text: str, status: str = "done", timeout: float = 20.0) -> Message:
    """Post `text`, wait for the one reply it starts to end with `status`, return it stored."""
    reply_id = await asked(m, text)
    await m.until(finished(reply_id, status), timeout=timeout)
    return await Message.objects.aget(pk=reply_id)


def personal_reply(world: World, recipient: Any, text: str) -> int:
    """A finished personal reply for `recipient` in the room (sync: ORM); its seq."""
    room = Room.objects.get(pk=world.room.pk)
    room.last_seq += 1
    room.save(update_fields=["last_seq"])
    Message.objects.create(
        room=room, seq=room.last_seq, role="assistant", author_name="A", text=text, recipient=recipient, status="done"
    )
    return room.last_seq


def parts(log: str) -> list[str]:
    """The run's log as its parts' first lines, in order (plan, steps, calls, results, checks)."""
    return [line for line in log.splitlines() if line and line[0] in "▸→←✗✓■"]


async def test_members_see_the_plan_calls_results_and_answer_in_order_live(world: World, sim: Any) -> None:
    await agent(world)
    async with member(world.alice) as alice, member(world.bob) as bob:
        stored = await run_to_end(alice, '@planner what is 6*7? {{tool calculate {"expression": "6*7"}}}')
        await bob.until(finished(stored.id))
    assert stored.agent_steps == 4  # plan, a step with a call, its check, the answer
    shown = parts(stored.reasoning)
    assert shown[0] == "▸ Plan"
    assert shown[1] == "▸ Step 2"
    assert shown[2] == '→ calculate({"expression": "6*7"})'
    assert shown[3] == "← calculate: 42"
    assert shown[4].startswith("▸ Check: ON PLAN")
    assert shown[5:] == ["▸ Step 4", "✓ Final answer"]
    for m in (alice, bob):
        log, pieces = thinking_seen(m, stored.id)
        assert log == stored.reasoning and len(pieces) > 1  # streamed, gap-free, and what is stored
        assert m.frames.replies[stored.id].text == stored.text  # the answer, apart from the log
        final = next(f for f in m.raw if f'id="msg-{stored.id}"' in f and 'hx-swap-oob="true"' in f)
        assert "<summary>Agent run</summary>" in final and 'data-steps="4"' in final
        # Ended, its log is rendered once: one line a step or call, the model's Markdown formatted.
        assert f'<div id="msg-{stored.id}-thinking" class="thinking-body md">' in final
        (log_html,) = [t.text for t in thinking_shown(final) if t.msg == stored.id]
        assert "<p>▸ Plan<br>" in log_html and '→ calculate({"expression": "6*7"})' in log_html
        assert "```" not in log_html and "**" not in log_html  # the model's Markdown, formatted
        labels = [s.group(2) for f in m.raw for s in STATE.finditer(f) if int(s.group(1)) == stored.id]
        assert any(label.startswith("step 2 of 8 ·") for label in labels)  # the budget, live
    assert stored.text and stored.status == "done"
    # The model was given the tool's result, and later turns see only the answer.
    request = next(r for r in reversed(sim[1].recorded) if r.get("tools") and "6*7" in str(r["messages"]))
    assert any(msg.get("role") == "tool" and msg.get("content") == "42" for msg in request["messages"])
    await await_history(world, sim, stored)


async def await_history(world: World, sim: Any, run: Message) -> None:
    async with member(world.alice) as alice:
        await run_to_end(alice, "@a what did the planner say?")
    request = next(r for r in reversed(sim[1].recorded) if "what did the planner say" in str(r["messages"]))
    sent = "\n".join(str(m.get("content")) for m in request["messages"])
    assert run.text in sent and "▸ Plan" not in sent and "← calculate" not in sent  # the answer, not the log


async def test_a_reconnect_mid_run_resumes_with_no_gap(world: World) -> None:
    await agent(world, model="sim+slow")  # a plan of 60 tokens at 150 tokens/s: ~0.4 s
    async with member(world.alice) as alice:
        reply_id = await asked(alice, "@planner go {{tool current_time {}}}")
        await alice.until(lambda f: len(thinking_seen(alice, reply_id)[1]) >= 2)
        async with member(world.bob) as late:
            at_connect = thinking_at_connect(late, reply_id)
            await late.until(finished(reply_id), timeout=30)
        await alice.until(finished(reply_id), timeout=30)
    stored = await Message.objects.aget(pk=reply_id)
    late_log, late_pieces = thinking_seen(late, reply_id)
    assert late_pieces[0][0] == at_connect  # resumed exactly where the snapshot ended
    assert late_log == stored.reasoning == thinking_seen(alice, reply_id)[0]
    assert "→ current_time({})" in stored.reasoning


async def test_bad_arguments_are_reported_and_the_run_goes_on(world: World) -> None:
    await agent(world)
    async with member(world.alice) as alice:
        stored = await run_to_end(
            alice,
            '@planner {{tool calculate {"expression": }}{{tool nosuchtool {}}}{{next}}{{tool calculate {"expression": "2+2"}}}',
        )
    shown = parts(stored.reasoning)
    errors = [p for p in shown if p.startswith("✗")]
    assert len(errors) == 2 and errors[0].startswith("✗ calculate:") and errors[1].startswith("✗ nosuchtool:")
    assert "← calculate: 4" in shown and shown[-1] == "✓ Final answer"
    assert stored.status == "done" and stored.text


async def test_the_step_budget_is_enforced(world: World) -> None:
    await agent(world, agent_steps=3)
    script = "{{tool current_time {}}}{{next}}" * 4
    async with member(world.alice) as alice:
        stored = await run_to_end(alice, f"@planner loop {script}")
    assert stored.agent_steps == 3 and stored.finish_reason == "budget.steps"
    # plan, one step with a call, then the last call answers with what it has (no check between)
    assert parts(stored.reasoning) == [
        "▸ Plan",
        "▸ Step 2",
        "→ current_time({})",
        next(p for p in parts(stored.reasoning) if p.startswith("← current_time: ")),
        "■ At its step budget (3 model calls): answering now",
        "▸ Step 3",
        "✓ Final answer",
    ]
    assert stored.text and stored.status == "done"


async def test_the_token_budget_is_enforced(world: World) -> None:
    await agent(world, agent_tokens=100)  # the plan alone takes 60
    async with member(world.alice) as alice:
        stored = await run_to_end(alice, "@planner {{tool current_time {}}}{{next}}{{tool current_time {}}}")
    assert stored.finish_reason == "budget.tokens" and stored.tokens is not None and stored.tokens <= 100
    assert "token budget (100 tokens)" in stored.text


async def test_a_revised_plan_when_the_check_says_replan(world: World) -> None:
    await agent(world)
    async with member(world.alice) as alice:
        stored = await run_to_end(alice, '@planner {{replan}}{{tool calculate {"expression": "1+1"}}}')
    shown = parts(stored.reasoning)
    assert next(p for p in shown if p.startswith("▸ Check")).startswith("▸ Check: REPLAN")
    assert "▸ Revised plan" in shown and shown[-1] == "✓ Final answer"


async def test_stop_mid_run_keeps_what_was_done(world: World) -> None:
    await agent(world, model="sim+slow")
    async with member(world.alice) as alice:
        reply_id = await asked(alice, "@planner {{tool current_time {}}}")
        await alice.until(lambda f: "→ current_time" in thinking_seen(alice, reply_id)[0], timeout=30)
        await alice.send(action="stop", message_id=reply_id)
        await alice.until(finished(reply_id, "stopped"))
    stored = await Message.objects.aget(pk=reply_id)
    shown, _ = thinking_seen(alice, reply_id)
    assert stored.reasoning.startswith(shown) and "→ current_time({})" in stored.reasoning
    assert stored.agent_steps is not None and stored.agent_steps >= 2


async def test_a_stop_mid_call_counts_that_calls_tokens(world: World) -> None:
    await agent(world, model="sim+slow")
    async with member(world.alice) as alice:
        # {{hold}}: a plan still streaming whenever the stop comes, however loaded the machine.
        reply_id = await asked(alice, "@planner plan slowly {{hold}}")
        await alice.until(lambda f: len(thinking_seen(alice, reply_id)[1]) >= 3)  # mid-plan
        await alice.send(action="stop", message_id=reply_id)
        await alice.until(finished(reply_id, "stopped"))
    stored = await Message.objects.aget(pk=reply_id)
    assert stored.agent_steps == 1 and "▸ Step" not in stored.reasoning
    words = len(stored.reasoning.removeprefix("▸ Plan\n").split())
    assert stored.tokens is not None and stored.tokens >= words > 0  # the plan's pieces so far
    assert stored.prompt_tokens and stored.cost is not None


async def test_an_answer_cut_at_the_token_limit_can_be_continued(world: World) -> None:
    await agent(world, max_tokens=10)  # the assistant's own limit, not the run's budget
    async with member(world.alice) as alice:
        stored = await run_to_end(alice, "@planner tell me everything")
        final = next(f for f in alice.raw if f'id="msg-{stored.id}"' in f and 'hx-swap-oob="true"' in f)
    assert stored.finish_reason == "length" and 'data-finish="length"' in final and "act continue" in final


async def test_tools_cannot_read_another_room_or_a_personal_reply(world: World) -> None:
    await agent(world)

    def setup() -> tuple[int, int]:
        other = Room.objects.create(name="Secret", slug="secret", owner=world.carol)
        Membership.objects.create(room=other, user=world.carol, role=Membership.Role.OWNER)
        Message.objects.create(
            room=other, seq=1, role="user", author=world.carol, author_name="carol", text="the secret plan"
        )
        Membership.objects.create(room=other, user=world.alice)  # the asker is in both rooms
        bobs = personal_reply(world, world.bob, "bob's private lens answer")
        return bobs, personal_reply(world, world.alice, "alice's own private answer")

    bobs, alices = await database_sync_to_async(setup)()
    async with member(world.alice) as alice, member(world.bob) as bob:
        stored = await run_to_end(
            alice,
            '@planner {{tool search_room {"query": "secret", "room": "secret"}}}'
            f'{{{{tool read_message {{"seq": {bobs}}}}}}}{{{{tool read_message {{"seq": {alices}}}}}}}'
            '{{tool search_room {"query": "answer"}}}{{tool search_room {"query": "secret"}}}',
        )
        await bob.until(finished(stored.id))
    results = [p for p in parts(stored.reasoning) if p[0] in "←✗"]
    assert results[0].startswith("✗ search_room:") and "unknown argument room" in results[0]  # this room only
    assert results[1] == f"← read_message: no message #{bobs}"  # as if it did not exist
    # A shared run's log reaches every member: not even the asker's own personal replies.
    assert results[2] == f"← read_message: no message #{alices}"
    assert results[3].startswith(f"← search_room: #{alices + 1} alice: @planner")  # the question alone
    assert "lens answer" not in stored.reasoning and "own private answer" not in stored.reasoning
    assert "lens answer" not in "".join(bob.raw) and "own private answer" not in "".join(bob.raw)
    assert results[4].startswith("← search_room: #") and "carol:" not in stored.reasoning  # not the other room's


async def test_two_agents_at_once_and_a_review_of_one_by_the_other(world: World, sim: Any) -> None:
    await agent(world, "planner")
    await agent(world, "critic")
    async with member(world.alice) as alice:
        await alice.post('@planner @critic what is 2**10? {{tool calculate {"expression": "2**10"}}}')
        await alice.until(lambda f: len(reply_ids(f)) == 2)
        first, second = reply_ids(alice.frames)
        await alice.until(lambda f: all(finished(i)(f) for i in (first, second)))
        for reply_id in (first, second):
            assert "← calculate: 1024" in (await Message.objects.aget(pk=reply_id)).reasoning
        planner = await Message.objects.select_related("assistant").aget(
            pk__in=(first, second), assistant__handle="planner"
        )
        review = await run_to_end(alice, "@critic review @planner")
    assert review.author_name == "CRITIC"  # the critic alone was asked
    request = next(r for r in reversed(sim[1].recorded) if "review @planner" in str(r["messages"]))
    last_user = [m for m in request["messages"] if m["role"] == "user"][-1]["content"]
    assert f"The answer of @planner (message #{planner.seq}) to review:\n\n{planner.text}" in last_user


async def test_a_personal_agent_run_reads_for_its_recipient_not_the_asker(world: World) -> None:
    """`/each @planner`: each member's run is theirs alone, so its tools read what that
    member may see: never the asker's own personal replies."""
    await agent(world)

    def setup() -> int:
        Membership.objects.filter(room=world.room).update(lens="be brief")
        return personal_reply(world, world.alice, "alice's private lens answer")

    seq = await database_sync_to_async(setup)()
    async with member(world.alice) as alice, member(world.bob) as bob:
        before = set(reply_ids(alice.frames))  # her personal reply above, in her snapshot
        await alice.post(f'/each @planner {{{{tool read_message {{"seq": {seq}}}}}}}')
        await bob.until(lambda f: len(reply_ids(f)) == 1)
        [bobs] = reply_ids(bob.frames)
        await bob.until(finished(bobs))
        await alice.until(lambda f: len(set(reply_ids(f)) - before) == 1)
        [alices] = set(reply_ids(alice.frames)) - before
        await alice.until(finished(alices))
    bob_run = await Message.objects.aget(pk=bobs)
    alice_run = await Message.objects.aget(pk=alices)
    assert bob_run.recipient_id == world.bob.id and f"← read_message: no message #{seq}" in bob_run.reasoning
    assert "private lens answer" in alice_run.reasoning  # her own, for her alone
    assert "private lens answer" not in "".join(bob.raw)


async def test_a_run_counts_against_the_rooms_budget_like_any_reply(world: World) -> None:
    await agent(world)
    await Room.objects.filter(pk=world.room.pk).aupdate(budget_tokens=100)  # the run alone spends more
    async with member(world.alice) as alice:
        stored = await run_to_end(alice, "@planner {{tool current_time {}}}")
        assert stored.tokens is not None and stored.tokens > 100  # every call's tokens, together
        await alice.post("@a and now?")
        await alice.until(lambda f: bool(f.errors))
    assert alice.frames.errors[0][0] == "room.budget"
    assert await Message.objects.filter(room=world.room, assistant__handle="a").acount() == 0
