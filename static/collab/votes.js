// Votes (collab/chat/actions/votes.py; docs/wire.md, "vote"): a vote frame replaces a
// reply's bar (#msg-N-votes); its counts and verdict are copied onto the article
// (data-votes-up, data-votes-down, data-verdict), and a rejected reply's "Show" button
// reopens it (it folds away by CSS).
(function () {
  "use strict";
  var doc = document;
  function sync(bar) {
    var article = bar.closest("article");
    if (!article) return;
    article.setAttribute("data-votes-up", bar.getAttribute("data-votes-up") || "0");
    article.setAttribute("data-votes-down", bar.getAttribute("data-votes-down") || "0");
    var verdict = bar.getAttribute("data-verdict");
    if (verdict) article.setAttribute("data-verdict", verdict);
    else article.removeAttribute("data-verdict");
    var reopen = bar.querySelector(".reopen");
    if (reopen) label(reopen, article.classList.contains("reopened"));
  }
  function label(button, open) {
    button.setAttribute("aria-expanded", open ? "true" : "false");
    button.textContent = open ? "Fold the rejected reply" : "Show the rejected reply";
  }
  doc.addEventListener("htmx:wsAfterMessage", function (e) {
    var text = e.detail && e.detail.message;
    if (typeof text !== "string" || text.indexOf('class="votes"') === -1 || text.indexOf("<article") !== -1) return;
    var m = /id="msg-(\d+)-votes"/.exec(text), bar = m && doc.getElementById("msg-" + m[1] + "-votes");
    if (bar) sync(bar);
  });
  doc.addEventListener("click", function (e) {
    var t = e.target.closest && e.target.closest("button.reopen");
    if (!t) return;
    label(t, t.closest("article").classList.toggle("reopened"));
  });
})();
