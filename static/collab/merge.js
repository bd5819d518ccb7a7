// Merge (docs/wire.md, "merge"): a person's message shows its Merge button while two or
// more of its replies in the page (`data-reply-to`) carry an approved vote bar
// (`.votes[data-verdict="approved"]`, sent again live at each vote). The server decides:
// fewer than two approved answers get merge.not_enough.
(function () {
  "use strict";
  var doc = document, pending = false;
  function mark() {
    pending = false;
    var list = doc.getElementById("messages");
    if (!list) return;
    var counts = {};
    list.querySelectorAll("article.msg-assistant[data-reply-to]:not([data-recipient])").forEach(function (a) {
      if (!a.querySelector('.votes[data-verdict="approved"]')) return;
      var to = a.getAttribute("data-reply-to");
      counts[to] = (counts[to] || 0) + 1;
    });
    list.querySelectorAll("article.msg-user").forEach(function (q) {
      if ((counts[q.id.replace("msg-", "")] || 0) >= 2) q.setAttribute("data-mergeable", "1");
      else q.removeAttribute("data-mergeable");
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
