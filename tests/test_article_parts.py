"""An article writes its empty reaction bar and empty thread line itself, to spare a render
each (templates/chat/_article.html): what it writes must be what their own templates make,
or a reaction or a thread's first reply would replace them with something else."""

from __future__ import annotations

import re
import uuid

from django.template.loader import render_to_string

from collab.chat import rendering
from collab.chat.models import Message
from collab.chat.reactionbar import bar
from collab.chat.replies import posting
from tests.conftest import World


def _part(html: str, element_id: str) -> str:
    found = re.search(rf'<div id="{element_id}"[^>]*>.*?</div>', html, re.S)
    assert found is not None, f"no #{element_id} in the article"
    return found.group(0)


def test_the_empty_bar_and_thread_line_are_their_templates(world: World) -> None:
    result, (reply,), _ = posting.store_post(world.alice.id, world.room.id, "@a hello", uuid.uuid4())
    post = Message.objects.get(pk=result.message.pk)
    Message.objects.filter(pk=reply.pk).update(status=Message.Status.DONE, text="hi", html="<p>hi</p>")
    for message in (post, Message.objects.get(pk=reply.pk)):
        assert message.reactions in (None, [], {})
        article = rendering.frame_final(message)
        assert _part(article, f"msg-{message.pk}-reactions") == bar(message)
    line = render_to_string("chat/_thread_line.html", {"m": post, "oob": False}).strip()
    assert _part(rendering.frame_final(post), f"msg-{post.pk}-thread") == line
    # The steer button is written into a streaming reply's header, beside Stop.
    streaming = rendering.frame_final(reply)
    assert f'class="act steer" data-steer="{reply.pk}"' in streaming
