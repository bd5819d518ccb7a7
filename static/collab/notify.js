// Notifications (docs/wire.md, "notify"): while this tab is hidden, the browser's
// Notification API tells the member when they are mentioned, or when an assistant's reply
// to them (to a message they posted, or a personal reply for them) ends; with "every
// message", also when anyone else posts; and when someone mentions them in another of
// their rooms (its sidebar entry's mark, unless that room's level is "none"). Only after
// they allowed it from the page (#notify-allow calls Notification.requestPermission:
// never unprompted). The tab's title shows the room's unread count while hidden,
// "(3) NAME · collab": the server's count for this room as of its last read (the
// sidebar's entry, services/unread.py), plus the messages that arrived since (the socket
// sends no entry of its own room per post).
(function () {
  "use strict";
  var doc = document, seenStreaming = {}, told = {}, known = {}, arrived = 0;
  var PREFIX = /^\(\d+\)\s/;

  function roomEl() { return doc.querySelector(".room[data-room-id]"); }
  function me() { var r = roomEl(); return r ? r.getAttribute("data-me") || "" : ""; }
  function level() {
    var f = doc.getElementById("notify");
    return f ? f.getAttribute("data-level") || "mentions" : "none";
  }
  function hidden() { return doc.visibilityState === "hidden"; }
  function supported() { return typeof window.Notification === "function"; }

  function entryId() { var r = roomEl(); return r ? "nav-room-" + r.getAttribute("data-room-id") : ""; }
  function unread() {
    var li = doc.getElementById(entryId());
    return (li ? Number(li.getAttribute("data-unread")) || 0 : 0) + arrived;
  }
  function countable(a) { // as the server counts (services/unread.py): not mine; the page sees only what is for me
    return a.getAttribute("data-role") === "assistant" || a.getAttribute("data-author") !== me();
  }
  function title() {
    var base = doc.title.replace(PREFIX, ""), n = hidden() ? unread() : 0;
    var want = n ? "(" + n + ") " + base : base;
    if (doc.title !== want) doc.title = want;
  }

  function mentions(text, name) {
    if (!name) return false;
    var esc = name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    return new RegExp("(^|[^\\w@])@" + esc + "(?![\\w@+-]|\\.[\\w])", "i").test(text);
  }
  function excerpt(article) {
    var body = article.querySelector("[id$='-body']") || article;
    var t = (body.textContent || "").replace(/\s+/g, " ").trim();
    return t.length > 140 ? t.slice(0, 139) + "…" : t;
  }
  function roomName() { var h = doc.getElementById("room-name"); return h ? h.textContent.trim() : ""; }
  function show(key, head, body) {
    if (told[key] || !supported() || Notification.permission !== "granted") return;
    told[key] = true;
    try {
      var n = new Notification(head, { body: body, tag: "collab-" + key });
      n.onclick = function () { window.focus(); n.close(); };
    } catch (err) { /* a browser that only notifies from a service worker: the title still counts */ }
  }

  function askedBy(reply) { // the author of the message a reply answers
    var to = reply.getAttribute("data-reply-to"), q = to ? doc.getElementById("msg-" + to) : null;
    return q ? q.getAttribute("data-author") : null;
  }
  function consider(a) {
    var id = a.id, status = a.getAttribute("data-status"), role = a.getAttribute("data-role");
    var who = me(), lv = level(), name = roomName();
    if (!id) return;
    if (status === "streaming") { seenStreaming[id] = true; return; }
    if (!hidden() || lv === "none" || a.getAttribute("data-deleted") === "1") return;
    if (role === "user") {
      if (a.getAttribute("data-author") === who || told[id]) return;
      var text = excerpt(a), mention = mentions(text, who);
      if (mention || lv === "all") {
        show(id, (mention ? a.getAttribute("data-author") + " mentioned you in " : a.getAttribute("data-author") + " in ") + name, text);
      }
    } else if (role === "assistant" && seenStreaming[id]) { // a reply this page saw streaming has ended
      delete seenStreaming[id];
      var mine = a.getAttribute("data-recipient") === who || askedBy(a) === who;
      if (mine || lv === "all") {
        show(id + "-end", a.getAttribute("data-author") + (mine ? " answered you in " : " answered in ") + name, excerpt(a));
      }
    }
  }

  var marked = {}; // rooms whose mention mark this page has seen
  function elsewhere() { // another room of mine: someone mentioned me there (its sidebar entry)
    doc.querySelectorAll("#rooms-list .nav-room").forEach(function (li) {
      var on = li.getAttribute("data-mention") === "1", id = li.id, a = li.querySelector("a");
      if (on && !marked[id] && hidden() && id !== entryId() && li.getAttribute("data-notify") !== "none") {
        show(id + "-" + li.getAttribute("data-unread"), "You were mentioned in " + (a ? a.textContent : "a room"), "");
      }
      marked[id] = on;
    });
  }
  doc.addEventListener("htmx:wsAfterMessage", function (e) {
    var text = e.detail && e.detail.message;
    if (typeof text === "string" && text.indexOf("<article") !== -1) {
      var snapshot = text.indexOf('id="messages" hx-swap-oob="true"') !== -1;
      // The frame is swapped in by now: read its articles from the page.
      var ids = text.match(/<article id="msg-\d+"/g) || [];
      ids.forEach(function (m) {
        var a = doc.getElementById(m.slice(13, -1));
        if (!a) return;
        var fresh = !known[a.id];
        known[a.id] = true;
        if (snapshot) { if (a.getAttribute("data-status") === "streaming") seenStreaming[a.id] = true; return; }
        if (fresh && hidden() && countable(a)) arrived++;
        consider(a);
      });
    }
    if (typeof text === "string" && text.indexOf('id="' + entryId() + '"') !== -1) arrived = 0; // read: the server's count
    if (typeof text === "string" && text.indexOf('data-mention="1"') !== -1) elsewhere();
    title();
  });
  doc.addEventListener("visibilitychange", function () {
    if (!hidden()) arrived = 0; // the page reads what it shows (sidebar.js)
    title();
  });

  function permissionShown() {
    var b = doc.getElementById("notify-allow"), s = doc.getElementById("notify-status");
    if (!b || !s) return;
    if (!supported()) { b.hidden = true; s.textContent = "This browser cannot show notifications."; return; }
    var p = Notification.permission;
    b.hidden = p !== "default";
    s.textContent = p === "granted" ? "Browser notifications are on for this site."
      : p === "denied" ? "Notifications are blocked in this browser's settings." : "";
  }
  doc.addEventListener("click", function (e) {
    var t = e.target;
    if (!t || t.id !== "notify-allow" || !supported()) return;
    var asked = Notification.requestPermission(permissionShown);
    if (asked && asked.then) asked.then(permissionShown);
  });
  doc.addEventListener("change", function (e) { // a choice is saved at once
    var t = e.target, f = t && t.form;
    if (f && f.id === "notify" && t.name === "level" && f.requestSubmit) f.requestSubmit();
  });
  doc.addEventListener("htmx:oobAfterSwap", function (e) {
    var t = e.detail && e.detail.target;
    if (t && t.id === "notify") permissionShown();
  });
  doc.addEventListener("DOMContentLoaded", function () {
    doc.querySelectorAll("#rooms-list .nav-room").forEach(function (li) { marked[li.id] = li.getAttribute("data-mention") === "1"; });
    doc.querySelectorAll("#messages article[id]").forEach(function (a) {
      known[a.id] = true;
      if (a.getAttribute("data-status") === "streaming") seenStreaming[a.id] = true;
    });
    permissionShown();
    title();
  });
  window.collabNotify = { title: title };
})();
