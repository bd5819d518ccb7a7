// Merge (docs/wire.md, "merge"): while two or more replies to one person's message
// (`data-reply-to`) carry an approved vote bar (`.votes[data-verdict="approved"]`, sent
// again live at each vote), the message is marked `data-mergeable` (its toolbar's Merge
// shows) and a "Merge these N answers" button stands under the last of them, where the
// reader is looking. The server decides: fewer than two approved get merge.not_enough.
(function () {
  "use strict";
  var doc = document, pending = false;
  function button(question, count) {
    var t = doc.getElementById("merge-these-template");
    if (!t) return null;
    var box = t.content.firstElementChild.cloneNode(true), b = box.querySelector("button");
    box.setAttribute("data-for", question);
    b.setAttribute("hx-vals", JSON.stringify({ action: "merge", message_id: Number(question) }));
    b.textContent = "Merge these " + count + " answers";
    return box;
  }
  function mark() {
    pending = false;
    var list = doc.getElementById("messages");
    if (!list) return;
    var approved = {};
    list.querySelectorAll("article.msg-assistant[data-reply-to]:not([data-recipient])").forEach(function (a) {
      if (!a.querySelector('.votes[data-verdict="approved"]') || a.hasAttribute("data-merge-of")) return;
      var to = a.getAttribute("data-reply-to");
      (approved[to] = approved[to] || []).push(a);
    });
    list.querySelectorAll("article.msg-user").forEach(function (q) {
      if ((approved[q.id.replace("msg-", "")] || []).length >= 2) q.setAttribute("data-mergeable", "1");
      else q.removeAttribute("data-mergeable");
    });
    var readOnly = !!doc.querySelector(".room.read-only");
    list.querySelectorAll(".merge-these").forEach(function (box) {
      var answers = approved[box.getAttribute("data-for")] || [];
      if (readOnly || answers.length < 2) box.parentNode.removeChild(box);
    });
    if (readOnly) return;
    Object.keys(approved).forEach(function (question) {
      var answers = approved[question];
      if (answers.length < 2 || !doc.getElementById("msg-" + question)) return;
      var last = answers[answers.length - 1], box = list.querySelector('.merge-these[data-for="' + question + '"]');
      var label = "Merge these " + answers.length + " answers";
      if (box && box.previousElementSibling === last && box.textContent.trim() === label) return;
      if (box) box.parentNode.removeChild(box);
      box = button(question, answers.length);
      if (!box) return;
      last.after(box);
      if (window.htmx) htmx.process(box);
    });
  }
  function soon() {
    if (!pending) { pending = true; setTimeout(mark, 200); }
  }
  doc.addEventListener("DOMContentLoaded", function () {
    mark();
    new MutationObserver(soon).observe(doc.body, { childList: true, subtree: true });
  });
})();
