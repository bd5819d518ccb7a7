// A reply's versions (docs/wire.md, "show a version"): its ‹ and › buttons send
// show_version, and the server swaps the slot's article on every page (data-slot). On the
// page that clicked, the button it clicked is gone with the old article: the focus goes to
// the same button of the new one (or the other, at either end), and the page says which
// version it shows now.
(function () {
  "use strict";
  var doc = document, asked = null; // the last click: {slot, which, from}
  doc.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("button.act.version");
    var article = button && button.closest("article[data-slot]");
    if (!article) return;
    asked = { slot: article.getAttribute("data-slot"), which: button.classList.contains("prev") ? "prev" : "next", from: article.id };
  });
  doc.addEventListener("htmx:wsAfterMessage", function () {
    if (!asked) return;
    var article = doc.querySelector('#messages article[data-slot="' + asked.slot + '"]');
    if (!article || article.id === asked.from) return; // not swapped yet
    var button = article.querySelector("button.act.version." + asked.which + ":not([disabled])") ||
      article.querySelector("button.act.version:not([disabled])");
    if (button && (!doc.activeElement || doc.activeElement === doc.body)) button.focus();
    var count = article.querySelector(".version-count"), announcer = doc.getElementById("announcer");
    if (count && announcer) announcer.textContent = "Version " + count.textContent.replace(" / ", " of ") + " shown.";
    asked = null;
  });
})();
