"""A reasoning model's thinking (issue 11, part 3): read from both dialects by the real
openai client, streamed apart from the answer (`msg-N-thinking`, offsets of its own) to
real WebSocket clients, resumed after a reconnect like the answer, stored apart, counted
in the reply's tokens, and never sent back to the model as history."""

from __future__ import annotations

import html
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from collab.chat.models import Message
from collab.llm import Endpoint, Finish, Thought, Usage, stream_chat
from collab.llm.client import aclose_clients
from collab.loadtest.wire import parse_frame, thinking_pieces, thinking_shown
from collab.simulator.text import expected_text, thinking_tokens
from tests.conftest import SIM_TOKENS, Member, World, member, reply_ids
from tests.test_llm_client import chunk, serve

PROMPT = [{"role": "user", "content": "think first"}]


def thinking_seen(m: Member, reply_id: int) -> tuple[str, list[tuple[int, int]]]:
    """The thinking a client was shown (the last snapshot's, then every piece after it, each
    checked to start where the text so far ends), and its pieces as (offset, length)."""
    text, pieces = "", []
    for frame in m.raw:
        for shown in thinking_shown(frame):
            if shown.msg == reply_id and shown.length is not None:  # a snapshot: start again
                assert shown.start is None  # the whole text so far (no data-from)
                text, pieces = shown.text, []
                assert len(text) == shown.length
        for piece in thinking_pieces(frame.encode()):
            if piece.msg != reply_id:
                continue
            assert piece.offset == len(text), f"a gap or an overlap at {piece.offset} (shown {len(text)})"
            text += piece.text
            pieces.append((piece.offset, len(piece.text)))
    return text, pieces


def thinking_at_connect(late: Member, reply_id: int) -> int:
    """The length L of the thinking in a socket's first frame (its snapshot), checked to hold
    all of it (data-length L, no data-from)."""
    shown = thinking_shown(late.raw[0])
    assert shown and shown[0].msg == reply_id and shown[0].start is None
    at_connect = shown[0].length
    assert at_connect is not None and at_connect > 0 and len(shown[0].text) == at_connect
    return at_connect


def finished(reply_id: int, status: str = "done") -> Any:
    return lambda f: (
        f.replies.get(reply_id) is not None and f.replies[reply_id].final_attrs.get("data-status") == status
    )


async def use_model(world: World, model: str, handle: str = "a") -> None:
    assistant = world.assistants[handle]
    assistant.model = model
    await database_sync_to_async(assistant.save)()


# --- the model client: both dialects, through the openai SDK --------------------------------------


@pytest.mark.parametrize("model", ["sim+think@7", "sim+reasoning@7"])
async def test_both_dialects_are_read_apart_from_the_answer(sim_url: str, model: str) -> None:
    """vLLM's `reasoning_content` and Cerebras'/OpenRouter's `reasoning`, from the simulated
    model over HTTP: thoughts first, then the answer, then usage counting both."""
    try:
        items = [x async for xs in stream_chat(Endpoint(sim_url, max_retries=0), model, PROMPT) for x in xs]
    finally:
        await aclose_clients()
    thoughts = [x.text for x in items if isinstance(x, Thought)]
    answer = [x for x in items if isinstance(x, str)]
    assert thoughts == thinking_tokens(PROMPT, 1, model, 7)
    assert "".join(answer) == expected_text(PROMPT, 1, model, SIM_TOKENS)
    assert items.index(answer[0]) == len(thoughts)  # the thinking came first
    usage = [x for x in items if isinstance(x, Usage)]
    assert usage and usage[0].completion_tokens == 7 + SIM_TOKENS
    assert not [x for x in items if isinstance(x, Finish)]  # "stop": no Finish item


async def test_max_tokens_counts_the_thinking_and_ends_length(sim_url: str) -> None:
    try:
        items = [
            x
            async for xs in stream_chat(Endpoint(sim_url, max_retries=0), "sim+think@5", PROMPT, max_tokens=8)
            for x in xs
        ]
    finally:
        await aclose_clients()
    assert len([x for x in items if isinstance(x, Thought)]) == 5
    assert len([x for x in items if isinstance(x, str)]) == 3
    assert items[-1] == Finish("length")


async def test_a_chunk_at_the_switch_holding_both_fields_keeps_both_in_order() -> None:
    """vLLM's reasoning parser sends the end of the thinking and the start of the answer
    in one delta when both are in one step."""
    events = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "Hmm, "}),
        chunk({"reasoning_content": "two.", "content": "Two"}),
        chunk({"content": " it is."}),
        chunk({}, "stop"),
        b"data: [DONE]\n\n",
    ]
    server, url = await serve(events)
    try:
        async with server:
            items = [x async for xs in stream_chat(Endpoint(url, max_retries=0), "m", PROMPT) for x in xs]
    finally:
        server.close()
        await aclose_clients()
    assert items == [Thought("Hmm, "), Thought("two."), "Two", " it is."]


# --- the room ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("layer", "replies_idle")
async def test_thinking_streams_apart_and_is_never_history(world: World, sim: tuple[str, Any]) -> None:
    await use_model(world, "sim+think@12")
    app = sim[1]
    async with member(world.alice) as alice, member(world.bob) as bob:
        await alice.post("@a think about it")
        await alice.until(lambda f: len(reply_ids(f)) == 1)
        [reply_id] = reply_ids(alice.frames)
        for m in (alice, bob):
            await m.until(finished(reply_id))
        stored = await Message.objects.aget(pk=reply_id)
        question = (await Message.objects.aget(pk=stored.reply_to_id)).text
        assert stored.reasoning and stored.reasoning not in stored.text
        for m in (alice, bob):
            shown, pieces = thinking_seen(m, reply_id)
            assert shown == stored.reasoning and pieces  # all of it, as pieces of its own, offsets from 0
            assert m.frames.replies[reply_id].text == stored.text  # the answer's pieces hold no thinking
            first_thought = next(i for i, f in enumerate(m.raw) if thinking_pieces(f.encode()))
            first_answer = next(i for i, f in enumerate(m.raw) if parse_frame(f.encode()).kind == "delta")
            assert first_thought < first_answer
            final = m.frames.replies[reply_id]
            assert final.final_attrs["data-tokens"] == str(12 + SIM_TOKENS)  # the reply's tokens hold its thinking
        # The final article shows it folded; the answer's body is the answer only.
        final_frame = next(f for f in alice.raw if f'id="msg-{reply_id}"' in f and 'hx-swap-oob="true"' in f)
        assert '<details class="thinking"><summary>Thinking</summary>' in final_frame
        assert html.escape(stored.reasoning) in final_frame
        assert stored.tokens == 12 + SIM_TOKENS
        # The recorded request of the first reply ...
        first = next(r for r in reversed(app.recorded) if "think about it" in str(r["messages"]))
        assert stored.reasoning not in str(first["messages"])
        # ... and of the next one: the first answer is history, its thinking is not.
        await alice.post("@a and now?")
        await alice.until(lambda f: len(reply_ids(f)) == 2)
        second_id = max(reply_ids(alice.frames))
        await alice.until(finished(second_id))
    second = next(r for r in reversed(app.recorded) if "and now?" in str(r["messages"]))
    sent = "\n".join(str(m["content"]) for m in second["messages"])
    assert question in sent and stored.text in sent
    assert stored.reasoning not in sent and stored.reasoning[: len(stored.reasoning) // 2] not in sent
    # The transcript shows it folded, before the answer.
    transcript = await exported(world.alice, "md")
    assert f"<details><summary>Thinking</summary>\n\n{stored.reasoning}\n\n</details>\n\n{stored.text}" in transcript
    records = json.loads(await exported(world.alice, "json"))["messages"]
    record = next(r for r in records if r["id"] == reply_id)
    assert (record["reasoning"], record["text"], record["finish_reason"]) == (stored.reasoning, stored.text, None)


async def exported(user: Any, fmt: str) -> str:
    """The member's transcript, read as Daphne does (the streamed body is an async iterator)."""
    client = AsyncClient()
    await client.aforce_login(user)
    response = await client.get(f"/r/lab/export.{fmt}", secure=True)
    assert response.status_code == 200
    return b"".join([chunk async for chunk in response.streaming_content]).decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("layer", "replies_idle")
async def test_a_member_who_connects_mid_thinking_resumes_it_gap_free(world: World) -> None:
    """The snapshot holds the thinking so far (data-length L) and the pieces that follow
    start at L: none lost, none twice (the socket's own floor for the thinking)."""
    await use_model(world, "sim+slow+think@3000")  # ~20 s of thinking: stopped once shown
    async with member(world.alice) as alice:
        await alice.post("@a think slowly")
        await alice.until(lambda f: len(reply_ids(f)) == 1)
        [reply_id] = reply_ids(alice.frames)
        await alice.until(lambda f: len(thinking_seen(alice, reply_id)[1]) >= 2)
        async with member(world.bob) as late:
            at_connect = thinking_at_connect(late, reply_id)
            await late.until(lambda f: any(o >= at_connect for o, _ in thinking_seen(late, reply_id)[1]))
            await alice.send(action="stop", message_id=reply_id)
            await late.until(finished(reply_id, "stopped"))
        await alice.until(finished(reply_id, "stopped"))
    stored = await Message.objects.aget(pk=reply_id)
    late_text, late_pieces = thinking_seen(late, reply_id)
    alice_text, _ = thinking_seen(alice, reply_id)
    assert late_pieces[0][0] == at_connect  # resumed exactly where its snapshot ended
    assert stored.reasoning.startswith(late_text) and stored.reasoning.startswith(alice_text)
    assert stored.text == ""  # it never got to its answer


# --- byte budgets -------------------------------------------------------------------------------


def test_a_long_thinking_is_sent_as_its_tail_and_cut_in_the_final_article(settings: Any) -> None:
    """No frame grows with the thinking (Daphne's 1 MiB): a snapshot holds its tail
    (data-from, data-length exact), a final article an excerpt and its "show all"."""
    from django.utils import timezone

    from collab.chat import rendering

    settings.COLLAB = {**settings.COLLAB, "SNAPSHOT_BYTES": 64 * 1024, "ARTICLE_BYTES": 4 * 1024}
    thinking = "".join(f"step {i} & <so on>. " for i in range(20_000))  # ~400 KB, escaped larger
    live = Message(id=7, seq=3, room_id=1, role="assistant", status="streaming", author_name="A")
    live.created_at = timezone.now()
    html_text, _page = rendering.frame_snapshot(
        [live], {7: "the answer so far"}, has_older=False, room_slug="lab", live_thinking={7: thinking}
    )
    assert rendering.size(html_text) <= 64 * 1024
    (shown,) = thinking_shown(html_text)
    assert shown.length == len(thinking)
    start = shown.start
    assert start is not None and start > 0 and shown.text == thinking[start:]
    done = Message(id=8, seq=4, room_id=1, role="assistant", status="done", author_name="A", text="ok")
    done.created_at, done.html, done.reasoning = timezone.now(), "<p>ok</p>", thinking
    final = rendering.frame_final(done)
    assert rendering.size(final) < rendering.budget("FRAME_ARTICLE_BYTES") and "Show all the thinking" in final
    assert html.escape(thinking) in rendering.article(done)  # "show all": the whole article
