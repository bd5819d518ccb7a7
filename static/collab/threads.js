// Threads (docs/wire.md, "threads"): the panel a thread opens in, beside the room (full
// screen on a phone). htmx loads it from GET t/<id>/ (the "Reply in thread" button and the
// "N replies" line) into <aside id="thread">; the thread's frames come over the room's socket
// like every other: its new articles are appended to #thread-<id>-list by htmx itself (a
// page without that thread open has no such list, and htmx drops them), its pieces and
// final articles find their targets by id. This script only shows and hides the panel,
// runs its box (Enter sends, emptied once our message is in the thread), keeps the list in
// seq order, formats streaming replies (stream.js), and after a snapshot (a reconnect)
// takes the thread's streaming replies out of #thread-live and reads the list again.
(function () {
  "use strict";
  var doc = document;
  var pending = null; // the client_id of our last post in the thread, until its article arrives
  var live = []; // streaming articles of the open thread, formatted by stream.js
  var scheduled = false;

  function byId(id) { return doc.getElementById(id); }
  function panel() { return byId("thread"); }
  function view() { var p = panel(); return p ? p.querySelector(".thread-view") : null; }
  function openThread() { var v = view(); return v ? v.getAttribute("data-thread") : null; }
  function list() { var t = openThread(); return t ? byId("thread-" + t + "-list") : null; }
  function box() { return byId("thread-composer"); }
  function uuid4() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    var b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 15) | 64; b[8] = (b[8] & 63) | 128;
    var h = Array.prototype.map.call(b, function (x) { return (x + 256).toString(16).slice(1); }).join("");
    return h.slice(0, 8) + "-" + h.slice(8, 12) + "-" + h.slice(12, 16) + "-" + h.slice(16, 20) + "-" + h.slice(20);
  }
  function seqOf(a) { return Number(a.getAttribute("data-slot-seq") || a.getAttribute("data-seq")); }

  // One article per id (a shared personal reply comes again), in seq order.
  function tidy(el) {
    if (!el) return;
    var seen = {};
    el.querySelectorAll(":scope > article[id]").forEach(function (a) {
      if (seen[a.id] && seen[a.id] !== a) seen[a.id].replaceWith(a);
      seen[a.id] = a;
    });
    var all = Array.prototype.slice.call(el.querySelectorAll(":scope > article[data-seq]"));
    var sorted = all.slice().sort(function (a, b) { return seqOf(a) - seqOf(b); });
    for (var i = 0; i < sorted.length; i++) if (sorted[i] !== all[i]) { sorted.forEach(function (a) { el.appendChild(a); }); break; }
  }
  function render() {
    scheduled = false;
    var el = list();
    if (!el) { live = []; return; }
    var near = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
    tidy(el);
    var stream = window.collabStream;
    live = [];
    if (stream) {
      el.querySelectorAll("article[data-status=streaming]").forEach(function (a) {
        var s = stream.state(a);
        if (s) { live.push(s); stream.render(s); }
      });
    }
    // A code block wider than the narrow panel scrolls: reachable from the keyboard.
    el.querySelectorAll(".body.md pre:not([tabindex])").forEach(function (pre) { pre.tabIndex = 0; });
    accepted(el);
    if (near) el.scrollTop = el.scrollHeight;
  }
  function schedule() { if (!scheduled) { scheduled = true; requestAnimationFrame(render); } }

  function accepted(el) {
    var f = box();
    if (!pending || !f) return;
    if (!el.querySelector('article[data-client-id="' + pending + '"]')) return;
    f.text.value = "";
    f.client_id.value = uuid4();
    pending = null;
  }

  function show(on) {
    var p = panel(), room = doc.querySelector(".room");
    if (!p) return;
    p.hidden = !on;
    if (room) room.classList.toggle("thread-open", on);
    if (!on) { p.textContent = ""; live = []; pending = null; }
  }
  function opened() {
    show(true);
    var f = box(), el = list();
    if (f) {
      f.client_id.value = uuid4();
      f.text.focus();
    } else {
      var close = panel().querySelector(".thread-close");
      if (close) close.focus();
    }
    if (el) el.scrollTop = el.scrollHeight;
    var id = location.hash.slice(1), target = id && el ? el.querySelector("#" + CSS.escape(id)) : null;
    if (target) target.scrollIntoView({ block: "center" });
    schedule();
  }
  function close() {
    var t = openThread();
    show(false);
    var back = t && doc.querySelector("#msg-" + t + "-thread button, #msg-" + t + " .act.thread");
    if (back) back.focus();
  }

  doc.addEventListener("htmx:afterSwap", function (e) {
    if (e.detail && e.detail.target && e.detail.target.id === "thread") opened();
  });
  doc.addEventListener("click", function (e) {
    var t = e.target.closest && e.target.closest("button.thread-close");
    if (t) close();
    // A page without the panel (a message in context, ?at=): the thread opens in the live room.
    var open = !panel() && e.target.closest && e.target.closest(".act.thread, .open-thread");
    var m = open && /t\/([0-9]+)\//.exec(open.getAttribute("hx-get") || "");
    if (m) location.href = location.pathname + "?thread=" + m[1];
  });
  doc.addEventListener("keydown", function (e) {
    var f = box();
    if (e.key === "Escape" && panel() && !panel().hidden && panel().contains(e.target)) { close(); return; }
    if (!f || e.target !== f.text) return;
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      if (f.text.value.trim()) f.requestSubmit();
    }
  });
  doc.addEventListener("htmx:wsConfigSend", function (e) {
    var f = box();
    if (!f || e.target !== f) return;
    var params = e.detail.parameters, text = String(params.text || "").trim();
    if (!text) { e.preventDefault(); return; }
    params.thread = Number(f.getAttribute("data-thread"));
    pending = String(params.client_id).toLowerCase();
  });

  // After a snapshot: the thread's replies streaming now (with their text so far) go in
  // the open list, the rest of #thread-live is dropped, and the list is read again for
  // what was posted while the page was away (a streaming article already here is kept:
  // its pieces continue it).
  function resumed() {
    var holder = byId("thread-live"), el = list();
    if (!holder) return;
    if (el) {
      var t = openThread();
      Array.prototype.slice.call(holder.querySelectorAll(":scope > article")).forEach(function (a) {
        if (a.getAttribute("data-thread") !== t) return;
        var old = el.querySelector("#" + CSS.escape(a.id));
        if (old) old.replaceWith(a); else el.appendChild(a);
      });
    }
    holder.textContent = "";
    if (el) reread(openThread());
  }
  function reread(t) {
    fetch("t/" + t + "/", { credentials: "same-origin" }).then(function (r) { return r.ok ? r.text() : null; }).then(function (html) {
      var el = list();
      if (!html || !el || openThread() !== t) return;
      var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("thread-" + t + "-list");
      if (!fresh) return;
      Array.prototype.slice.call(fresh.querySelectorAll(":scope > article")).forEach(function (a) {
        var old = el.querySelector("#" + CSS.escape(a.id));
        if (old && old.getAttribute("data-status") === "streaming") return;
        var node = doc.importNode(a, true);
        if (old) old.replaceWith(node); else el.appendChild(node);
        if (window.htmx) htmx.process(node);
      });
      schedule();
    });
  }
  doc.addEventListener("htmx:oobAfterSwap", function (e) {
    var t = e.detail && e.detail.target;
    if (t && t.id === "thread-live") resumed();
  });
  doc.addEventListener("htmx:wsAfterMessage", function () { if (openThread()) schedule(); });

  // A search result in a thread links to the room with ?thread=ID: open it.
  doc.addEventListener("DOMContentLoaded", function () {
    var t = new URLSearchParams(location.search).get("thread");
    if (t && /^[0-9]+$/.test(t) && window.htmx && panel()) htmx.ajax("GET", "t/" + t + "/", { target: "#thread", swap: "innerHTML" });
  });
})();
