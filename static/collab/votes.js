// Votes (collab/chat/actions/votes.py; docs/wire.md, "vote"): a vote frame replaces a
// reply's bar (#msg-N-votes); its counts and verdict are copied onto the article
// (data-votes-up, data-votes-down, data-verdict), the viewer's own vote is marked
// pressed (aria-pressed; the page's CSS shows it too), and a rejected reply's "Show"
// button reopens it (it folds away by CSS).
(function () {
  "use strict";
  var doc = document;
  function me() {
    var room = doc.querySelector(".room[data-me]");
    return room ? room.getAttribute("data-me") : "";
  }
  function label(button, open) {
    button.setAttribute("aria-expanded", open ? "true" : "false");
    button.textContent = open ? "Fold the rejected reply" : "Show the rejected reply";
  }
  function sync(bar, name) {
    var article = bar.closest("article");
    if (!article) return;
    article.setAttribute("data-votes-up", bar.getAttribute("data-votes-up") || "0");
    article.setAttribute("data-votes-down", bar.getAttribute("data-votes-down") || "0");
    var verdict = bar.getAttribute("data-verdict");
    if (verdict) article.setAttribute("data-verdict", verdict);
    else article.removeAttribute("data-verdict");
    ["up", "down"].forEach(function (value) {
      var button = bar.querySelector(".act.vote." + value);
      var by = (bar.getAttribute("data-" + value + "-by") || "").split(" ");
      if (button) button.setAttribute("aria-pressed", name && by.indexOf(name) !== -1 ? "true" : "false");
    });
    var reopen = bar.querySelector(".reopen");
    if (reopen) label(reopen, article.classList.contains("reopened"));
  }
  function syncAll() {
    var name = me();
    doc.querySelectorAll("#messages .votes").forEach(function (bar) { sync(bar, name); });
  }
  doc.addEventListener("htmx:wsAfterMessage", function (e) {
    var text = e.detail && e.detail.message;
    if (typeof text === "string" && text.indexOf('class="votes"') !== -1) syncAll();
  });
  doc.addEventListener("htmx:afterSettle", syncAll); // "show all", older messages
  doc.addEventListener("DOMContentLoaded", syncAll);
  doc.addEventListener("click", function (e) {
    var t = e.target.closest && e.target.closest("button.reopen");
    if (t) label(t, t.closest("article").classList.toggle("reopened"));
  });
})();
