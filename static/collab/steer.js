// Steer (collab/chat/commands/steer.py; docs/wire.md, "steer a reply"): a streaming
// reply's Steer button opens a small form under its header; its note goes on the room's
// socket as {"action": "steer", "message_id": N, "text": NOTE} (htmx's ws-send), and the
// form closes. Everyone then sees the reply end its sentence, the marker "↪ steered by
// NAME: NOTE" (a paragraph of the reply's text: stream.js shows it as `p.steer-mark`
// while it streams, the server's Markdown as `span.steer-mark` once it has ended), and
// the reply go on. The reply's final article replaces the form with the rest.
(function () {
  "use strict";
  var doc = document, MAX = 300;

  function close(f, focus) {
    var article = f.closest("article"), button = article && article.querySelector("button.act.steer");
    f.parentNode.removeChild(f);
    if (button) {
      button.setAttribute("aria-expanded", "false");
      if (focus) button.focus();
    }
  }
  function open(button) {
    var article = button.closest("article"), id = button.getAttribute("data-steer");
    var existing = article.querySelector("form.steer-form");
    if (existing) { close(existing, true); return; }
    var f = doc.createElement("form");
    f.className = "steer-form";
    f.id = "msg-" + id + "-steer";
    f.setAttribute("ws-send", "");
    f.setAttribute("hx-vals", JSON.stringify({ action: "steer", message_id: Number(id) }));
    var label = doc.createElement("label");
    label.className = "visually-hidden";
    label.htmlFor = f.id + "-text";
    label.textContent = "A note this reply follows from its next sentence";
    var input = doc.createElement("input");
    input.type = "text";
    input.name = "text";
    input.id = f.id + "-text";
    input.maxLength = MAX;
    input.required = true;
    input.autocomplete = "off";
    input.placeholder = "Steer it: e.g. shorter, and in French";
    var send = doc.createElement("button");
    send.type = "submit";
    send.textContent = "Steer";
    var cancel = doc.createElement("button");
    cancel.type = "button";
    cancel.className = "link steer-cancel";
    cancel.textContent = "Cancel";
    f.append(label, input, send, cancel);
    article.querySelector("header").after(f);
    button.setAttribute("aria-controls", f.id);
    button.setAttribute("aria-expanded", "true");
    if (window.htmx) htmx.process(f);
    input.focus();
  }

  doc.addEventListener("click", function (e) {
    var t = e.target.closest && e.target.closest("button.act.steer, button.steer-cancel");
    if (!t) return;
    if (t.classList.contains("steer-cancel")) close(t.closest("form"), true);
    else open(t);
  });
  doc.addEventListener("keydown", function (e) {
    var f = e.key === "Escape" && e.target.closest && e.target.closest("form.steer-form");
    if (f) close(f, true);
  });
  // Nothing empty is sent; once sent, the form closes (the marker shows where it took).
  doc.addEventListener("htmx:wsConfigSend", function (e) {
    if (!e.target.classList || !e.target.classList.contains("steer-form")) return;
    if (!String(e.detail.parameters.text || "").trim()) e.preventDefault();
  });
  doc.addEventListener("htmx:wsAfterSend", function (e) {
    var f = e.target;
    if (f.classList && f.classList.contains("steer-form") && f.parentNode) close(f, false);
  });
})();
