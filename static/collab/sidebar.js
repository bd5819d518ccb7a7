// The sidebar of my rooms (templates/chat/_rooms_nav.html; docs/wire.md, "read"): the
// server keeps each room's unread count per member and the socket sends the entries live.
// This page marks its own room read while it is open and visible: the highest seq it
// shows, at most once a second, never lower than what it sent. Under 760px the list is a
// menu behind #rooms-toggle.
(function () {
  "use strict";
  var doc = document, sock = null, sent = 0, lastSentAt = 0, timer = null, arrived = 0;
  // A thread's messages count in the room's unread too: they come in frames to the hidden
  // #thread-live (threads.js keeps only the open thread's), so their seqs are taken as they
  // arrive, and an open page marks them read with the rest.
  var ARTICLE_SEQ = /<article\b[^>]*\bdata-seq="(\d+)"/g;
  var room = function () { return doc.querySelector(".room[data-room-id]"); };

  function maxSeq() {
    var top = arrived;
    doc.querySelectorAll("#messages article[data-seq]").forEach(function (a) {
      var s = Number(a.getAttribute("data-seq")) || 0;
      if (s > top) top = s;
    });
    return top;
  }
  function sendRead() {
    timer = null;
    var r = room();
    if (!sock || !r || r.hasAttribute("data-read-only") || doc.visibilityState !== "visible") return;
    var seq = maxSeq(), wait = 1000 - (Date.now() - lastSentAt);
    if (seq <= sent) return;
    if (wait > 0) { timer = setTimeout(sendRead, wait); return; }
    sent = seq;
    lastSentAt = Date.now();
    sock.send(JSON.stringify({ action: "read", seq: seq }), null);
  }
  function soon() { if (!timer) timer = setTimeout(sendRead, 150); }

  function total() { // the toggle's badge: unread in my other rooms
    var n = 0, badge = doc.getElementById("rooms-total");
    if (!badge) return;
    doc.querySelectorAll("#rooms-list .nav-room").forEach(function (li) {
      var a = li.querySelector("a");
      if (a && a.getAttribute("aria-current") === "page") return;
      n += Number(li.getAttribute("data-unread")) || 0;
    });
    badge.textContent = n ? String(n) : "";
    badge.hidden = !n;
  }

  doc.addEventListener("htmx:wsOpen", function (e) {
    sock = e.detail && e.detail.socketWrapper;
    sent = 0; // a new socket: say it again (the server ignores a mark that does not move)
    arrived = 0; // and count again from its snapshot
  });
  doc.addEventListener("htmx:wsClose", function () { sock = null; });
  doc.addEventListener("htmx:wsAfterMessage", function (e) {
    var text = e.detail && e.detail.message;
    if (typeof text === "string" && text.indexOf("<article") !== -1) {
      var m;
      ARTICLE_SEQ.lastIndex = 0;
      while ((m = ARTICLE_SEQ.exec(text)) !== null) arrived = Math.max(arrived, Number(m[1]));
      soon();
    }
    if (typeof text === "string" && text.indexOf("nav-room") !== -1) total();
  });
  doc.addEventListener("visibilitychange", function () { if (doc.visibilityState === "visible") soon(); });
  doc.addEventListener("click", function (e) {
    var t = e.target && e.target.closest ? e.target.closest("#rooms-toggle") : null;
    if (!t) return;
    var r = room(), open = t.getAttribute("aria-expanded") !== "true";
    t.setAttribute("aria-expanded", open ? "true" : "false");
    if (r) r.classList.toggle("show-rooms", open);
  });
  doc.addEventListener("DOMContentLoaded", total);
  window.collabSidebar = { maxSeq: maxSeq };
})();
