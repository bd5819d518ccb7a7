"""Files in the room, in Chromium (issue 36; docs/wire.md, "Files" and "Attachment markup"):
alice pastes a chart into the box and drops a PDF on the room; each uploads at once as a
chip with a progress bar (Send waits for it); sent with a question to @look, the message shows
the image as a thumbnail and the PDF as a card on her page and bob's, live; the thumbnail
opens large in a dialog; dave, not a member, gets 404 for the file; and the model's request
(the simulated model's record) holds the image as an `image_url` part and the PDF's text.
A refused file says why on its chip and is removed before sending. It takes the README's
picture of files in a room (docs/images/files.png is this test's screenshot "files"
(COLLAB_TEST_ARTIFACTS), copied there)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

import pytest

from collab.simulator.app import SimulatorApp
from tests.browser.conftest import (
    PASSWORD,
    axe_violations,
    finished,
    open_room,
    screenshot,
    send,
)

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(180)]

PLAN_WORDS = "Parser release planned for Friday the twelfth"
QUESTION = "@look what is wrong in this chart, and when does the plan ship?"

# A chart drawn in the page, as a screenshot would be, pasted into the box as a PNG file.
PASTE_CHART = """async (selector) => {
  const c = document.createElement('canvas');
  c.width = 640; c.height = 360;
  const g = c.getContext('2d');
  g.fillStyle = '#ffffff'; g.fillRect(0, 0, 640, 360);
  g.fillStyle = '#1d1d1f'; g.font = 'bold 22px sans-serif'; g.fillText('Sign-ups per week', 24, 40);
  const bars = [120, 180, 90, 260, 40, 300];
  bars.forEach((h, i) => { g.fillStyle = i === 4 ? '#b3261e' : '#2a55c0'; g.fillRect(60 + i * 92, 330 - h * 0.9, 60, h * 0.9); });
  g.strokeStyle = '#5c5c63'; g.beginPath(); g.moveTo(40, 330); g.lineTo(620, 330); g.stroke();
  const blob = await new Promise(r => c.toBlob(r, 'image/png'));
  const data = new DataTransfer();
  data.items.add(new File([blob], 'chart.png', {type: 'image/png'}));
  const box = document.querySelector(selector);
  box.focus();
  const paste = new ClipboardEvent('paste', {clipboardData: data, bubbles: true, cancelable: true});
  box.dispatchEvent(paste);
  return paste.defaultPrevented;
}"""

# Dragging a file over the room (the drop zone shows), then dropping it on the messages.
DRAG_IN = """({b64, name, type, on}) => {
  const bytes = Uint8Array.from(atob(b64), ch => ch.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], name, {type}));
  window.dragged = data;
  const over = document.querySelector(on);
  over.dispatchEvent(new DragEvent('dragenter', {dataTransfer: data, bubbles: true, cancelable: true}));
  over.dispatchEvent(new DragEvent('dragover', {dataTransfer: data, bubbles: true, cancelable: true}));
}"""
DROP = """(on) => {
  const drop = new DragEvent('drop', {dataTransfer: window.dragged, bubbles: true, cancelable: true});
  document.querySelector(on).dispatchEvent(drop);
  return drop.defaultPrevented;
}"""

# dave: no member of the room. @look: an assistant with a short answer (the simulated
# model's line saying what it got, then a few words), so that the picture holds it whole.
SETUP = f"""
from django.contrib.auth.models import User
from collab.chat.models import Assistant, Room
from collab.chat.services import providers
User.objects.create_user("dave", password="{PASSWORD}")
provider = providers.ensure_default_assistant().provider
look = Assistant.objects.create(handle="look", display_name="Look", provider=provider, model="sim", max_tokens=40,
                                available_to="everyone")
Room.objects.get(slug="lab").assistants.add(look)
"""


def pdf_with(text: str) -> bytes:
    """A one-page PDF that says `text` (Helvetica), its cross-reference table exact."""
    stream = f"BT /F1 18 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
    ]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def parts(request: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """Every content part of a recorded request's turns (a string turn: one text part)."""
    for turn in request["messages"]:
        content = turn.get("content")
        if isinstance(content, str):
            yield {"type": "text", "text": content}
        elif isinstance(content, list):
            yield from content


def asked(app: SimulatorApp, words: str) -> dict[str, Any]:
    """The last request the model got whose last turn holds `words`."""
    for request in reversed(app.recorded):
        if words in json.dumps(request["messages"][-1]):
            return request
    raise AssertionError(f"the model got no request ending with {words!r}")


def upload_url(page: Any) -> str:
    """The room's upload URL as a pattern for Playwright's route and waits."""
    return "**" + str(page.locator("#composer").get_attribute("data-upload-url"))


def held_upload(page: Any, held: list[Any]) -> Any:
    """The upload the page's route holds, once Playwright has delivered it (its events
    are delivered while a call waits on the page)."""
    for _ in range(400):
        if held:
            return held[0]
        page.wait_for_timeout(25)
    raise AssertionError("the upload never reached the route")


def test_paste_an_image_drop_a_pdf_send_and_everyone_sees_them(
    chromium: Any, site: Any, sim_app: tuple[str, SimulatorApp]
) -> None:
    site.shell(SETUP)
    alice = open_room(chromium, site, "alice", viewport={"width": 1280, "height": 800})
    bob = open_room(chromium, site, "bob")
    chips, send_button = alice.locator("#composer .file-chip"), alice.locator("#composer button[type=submit]")
    assert "Up to 10 files" in alice.locator("#composer-file-limits").inner_text()  # said before any file

    # Pasted: the chart uploads at once; its chip shows a preview, the name and size, and
    # its progress bar reaches the end.
    assert alice.evaluate(PASTE_CHART, "#message-box") is True  # the page took the paste
    chart = chips.filter(has_text="chart.png")
    chart.wait_for()
    assert chart.locator(".file-preview img").evaluate("img => img.src.startsWith('blob:')")
    assert "KB" in chart.locator(".file-size").inner_text()
    alice.wait_for_selector("#composer .file-chip[data-state=done]", state="attached")
    assert chart.locator("progress").evaluate("p => p.value === p.max")

    # Dropped on the room: the drop zone shows while the PDF is dragged over the page.
    # Its upload is held on the way (Playwright's route) so that the page is seen waiting:
    # Send is disabled and Enter sends nothing until it is in.
    held: list[Any] = []
    alice.route(upload_url(alice), lambda route: held.append(route))
    pdf = pdf_with(PLAN_WORDS)
    dragged = {"b64": base64.b64encode(pdf).decode(), "name": "plan.pdf", "type": "application/pdf", "on": "#messages"}
    alice.evaluate(DRAG_IN, dragged)
    assert alice.locator("#composer .drop-zone").is_visible()
    assert alice.evaluate(DROP, "#messages") is True
    assert not alice.locator("#composer .drop-zone").is_visible()
    plan = chips.filter(has_text="plan.pdf")
    plan.wait_for()
    assert plan.locator(".file-kind").inner_text() == "PDF"
    alice.wait_for_function("() => document.querySelectorAll('#composer .file-chip').length === 2")
    upload = held_upload(alice, held)  # the request is on its way
    assert plan.get_attribute("data-state") in ("uploading", "processing")
    assert plan.locator("progress").is_visible()
    assert send_button.is_disabled()
    box = alice.locator("#message-box")
    box.fill(QUESTION)
    box.press("Enter")
    alice.wait_for_selector("#composer .file-status:text('still uploading')", state="attached")
    assert box.input_value() == QUESTION
    upload.continue_()
    plan.and_(alice.locator("[data-state=done]")).wait_for()
    alice.unroute(upload_url(alice))
    assert send_button.is_enabled()

    # Sent: the message carries both; the chips go once it is in the room.
    box.press("Enter")
    mine = alice.locator("#messages article[data-role=user]", has_text="what is wrong in this chart").last
    mine.wait_for()
    alice.wait_for_function("() => !document.querySelector('#composer .file-chip')")
    assert alice.locator("#composer .file-chips").is_hidden() and box.input_value() == ""

    # Live on both pages: the chart as a thumbnail that loads, the PDF as a card.
    for page in (alice, bob):
        article = page.locator("#messages article[data-role=user]", has_text="what is wrong in this chart").last
        thumb = article.locator("a[data-lightbox] img")
        thumb.wait_for()
        page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=thumb.element_handle())
        card = article.locator("a[href*='/f/']:not([data-lightbox])", has_text="plan.pdf")
        card.wait_for()
    article = mine
    image_url = article.locator("a[data-lightbox]").get_attribute("href")
    thumb_url = article.locator("a[data-lightbox] img").get_attribute("src")
    pdf_url = article.locator("a[href*='/f/']:not([data-lightbox])", has_text="plan.pdf").get_attribute("href")

    # The thumbnail opens the image large; Escape closes it, back on the thumbnail.
    article.locator("a[data-lightbox]").click()
    lightbox = alice.locator("#lightbox")
    lightbox.wait_for()
    big = lightbox.locator(".lightbox-image")
    alice.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=big.element_handle())
    assert big.evaluate("img => new URL(img.src).pathname") == image_url
    assert "chart.png" in lightbox.inner_text()
    alice.keyboard.press("Escape")
    lightbox.wait_for(state="hidden")
    assert article.locator("a[data-lightbox]").evaluate("a => a === document.activeElement")

    # The files are the room's: a member gets them, dave (no member) a 404 for each.
    bob_files = bob.context.request
    assert bob_files.get(f"{site.url}{pdf_url}").status == 200
    dave = chromium.new_context()
    host = site.url.split("//", 1)[1].split(":")[0]
    dave.add_cookies([{"name": "sessionid", "value": site.cookie("dave"), "domain": host, "path": "/"}])
    for url in (image_url, thumb_url, pdf_url):
        assert dave.request.get(f"{site.url}{url}").status == 404, url

    # @look's answer in, the README's picture, and axe on the room with its files.
    finished(alice, 1)
    box.focus()
    alice.locator("#messages").evaluate("list => { list.scrollTop = list.scrollHeight; }")
    alice.mouse.move(1, 1)  # no article hovered: no toolbar over the picture
    alice.wait_for_function(
        "() => [...document.querySelectorAll('.msg > .tools')].every(t => getComputedStyle(t).opacity === '0')"
    )
    screenshot(alice, "files")
    violations = [v for v in axe_violations(alice) if v["id"] != "heading-order"]  # the model's own headings
    assert violations == [], violations

    # @look's request: the chart as an image part, the PDF's text.
    request = asked(sim_app[1], "what is wrong in this chart")
    images = [p for p in parts(request) if p.get("type") == "image_url"]
    assert len(images) == 1, images
    assert images[0]["image_url"]["url"].startswith("data:image/")  # the provider's default: data URLs
    seen = request["images"]  # the simulator's record of each: type, size, pixels
    assert [(i["width"], i["height"]) for i in seen] == [(640, 360)], seen  # the chart as it was pasted
    text = " ".join(str(p.get("text", "")) for p in parts(request) if p.get("type") == "text")
    assert PLAN_WORDS in text


def test_a_refused_file_says_why_and_goes_before_sending(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    box, chips = alice.locator("#message-box"), alice.locator("#composer .file-chip")

    # By the keyboard: the Attach button opens the file chooser. A page disguised as a PNG
    # is refused by the server, by its content; the chip says what the server said.
    attach = alice.get_by_role("button", name="Attach files")
    with alice.expect_file_chooser() as chooser:
        attach.press("Enter")  # focused, then Enter
    with alice.expect_response(upload_url(alice)) as answer:
        chooser.value.set_files(
            [{"name": "notes.png", "mimeType": "image/png", "buffer": b"<html><script>alert(1)</script></html>"}]
        )
    refused = chips.filter(has_text="notes.png")
    refused.and_(alice.locator("[data-state=error]")).wait_for()
    said = answer.value.json()["error"]
    assert answer.value.status in (400, 415, 422) and said["code"] == "file.type_refused"
    assert refused.locator(".file-error").inner_text() == said["message"]

    # Too large for the page's limit: refused here, with nothing sent.
    alice.locator("#composer").evaluate("f => f.setAttribute('data-max-file-bytes', '1000')")
    alice.locator("#composer-file-input").set_input_files(
        [{"name": "big.txt", "mimeType": "text/plain", "buffer": b"x" * 5000}]
    )
    big = chips.filter(has_text="big.txt")
    big.and_(alice.locator("[data-state=error]")).wait_for()
    assert "at most 1000 B" in big.locator(".file-error").inner_text()

    # Enter does not send a message with a refused file in it.
    box.fill("here are my notes")
    box.press("Enter")
    alice.wait_for_selector("#composer .file-status:text('remove it')", state="attached")
    assert box.input_value() == "here are my notes"

    # Removed (its remove button, by the keyboard): the focus goes to the next chip, then back to the box.
    refused.locator(".file-remove").focus()
    alice.keyboard.press("Enter")
    assert refused.count() == 0
    assert big.locator(".file-remove").evaluate("b => b === document.activeElement")
    alice.keyboard.press("Enter")
    assert chips.count() == 0 and box.evaluate("b => b === document.activeElement")

    # A removed upload in progress is aborted: its request never ends in a chip.
    held: list[Any] = []
    alice.route(upload_url(alice), lambda route: held.append(route))
    alice.locator("#composer-file-input").set_input_files(
        [{"name": "late.txt", "mimeType": "text/plain", "buffer": b"later"}]
    )
    held_upload(alice, held)
    chips.filter(has_text="late.txt").locator(".file-remove").click()
    assert chips.count() == 0
    alice.unroute_all(behavior="ignoreErrors")

    # More files than a message carries: those past the limit are not attached, said once.
    alice.locator("#composer").evaluate("f => f.setAttribute('data-max-files', '1')")
    two = [{"name": f"{n}.txt", "mimeType": "text/plain", "buffer": b"words"} for n in ("one", "two")]
    alice.locator("#composer-file-input").set_input_files(two)
    chips.filter(has_text="one.txt").and_(alice.locator("[data-state=done]")).wait_for()
    assert chips.count() == 1
    assert "1 of these was not attached" in alice.locator("#composer-file-status").inner_text()
    chips.locator(".file-remove").click()

    # Without files the box is as before: text is required, and the message goes.
    box.press("Enter")
    alice.locator("#messages article[data-role=user]", has_text="here are my notes").wait_for()
    alice.wait_for_function("() => document.querySelector('#message-box').value === ''")


def test_files_in_a_thread_go_to_its_box_and_may_go_without_text(chromium: Any, site: Any) -> None:
    alice = open_room(chromium, site, "alice")
    send(alice, "Screenshots of the release go in this thread")
    parent = alice.locator("#messages article[data-role=user]", has_text="Screenshots of the release").last
    parent.wait_for()
    parent.hover()
    parent.get_by_role("button", name="Reply in thread").click()
    alice.locator("#thread .thread-view").wait_for()
    parent_id = str(parent.get_attribute("id")).removeprefix("msg-")
    chips = alice.locator("#thread-composer .file-chip")
    assert alice.locator("#thread-composer .attach-button").is_visible()

    # Pasted into the thread's box, and a PDF dropped on the thread: both are the thread's.
    assert alice.evaluate(PASTE_CHART, "#thread-box") is True
    pdf = pdf_with("Release notes")
    dragged = {"b64": base64.b64encode(pdf).decode(), "name": "notes.pdf", "type": "application/pdf"}
    alice.evaluate(DRAG_IN, {**dragged, "on": f"#thread-{parent_id}-list"})
    assert alice.locator("#thread-composer .drop-zone").is_visible()
    assert alice.evaluate(DROP, f"#thread-{parent_id}-list") is True
    alice.wait_for_function(
        "() => document.querySelectorAll('#thread-composer .file-chip[data-state=done]').length === 2"
    )
    assert alice.locator("#composer .file-chip").count() == 0

    # Sent with no text: the thread shows the files; the chips go.
    alice.locator("#thread-box").press("Enter")
    reply = alice.locator(f"#thread-{parent_id}-list article[data-role=user]").last
    reply.locator("a[data-lightbox] img").wait_for()
    reply.locator("a[href*='/f/']:not([data-lightbox])", has_text="notes.pdf").wait_for()
    alice.wait_for_function("() => !document.querySelector('#thread-composer .file-chip')")
    assert chips.count() == 0
    assert alice.locator("#messages article[data-thread]").count() == 0  # not in the room's list
