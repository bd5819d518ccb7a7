// Threads (docs/wire.md, "Threads"): the panel a thread opens in, beside the room (full
// screen on a phone). htmx loads it from GET t/<id>/ (the "Reply in thread" button and the
// "N replies" line) into <aside id="thread">. A thread's frames come over the room's socket
// like every other: its new articles are appended to the hidden #thread-live (and a
// snapshot replaces it with the replies streaming in threads); pieces and final articles
// find their targets by id. This script deals #thread-live's articles out: those of the
// open thread into its list, a streaming reply of another thread stays in #thread-live
// (its pieces keep it exact until it ends; opening its thread takes it from there), the
// rest is dropped. It also shows and hides the panel, runs its box (Enter sends, emptied
// once our message is in the thread), keeps the list in seq order, and formats the
// streaming replies shown (stream.js).
(function () {
  "use strict";
  var doc = document;
  var pending = null; // the client_id of our last post in the thread, until its article arrives
  var scheduled = false;

  function byId(id) { return doc.getElementById(id); }
  function panel() { return byId("thread"); }
  function holder() { return byId("thread-live"); }
  function view() { var p = panel(); return p ? p.querySelector(".thread-view") : null; }
  function openThread() { var v = view(); return v ? v.getAttribute("data-thread") : null; }
  function list() { var t = openThread(); return t ? byId("thread-" + t + "-list") : null; }
  function box() { return byId("thread-composer"); }
  function uuid4() { return window.collabIds.uuid4(); } // collab.js's: a post's client_id
  function seqOf(a) { return Number(a.getAttribute("data-slot-seq") || a.getAttribute("data-seq")); }
  function children(el) { return Array.prototype.slice.call(el.querySelectorAll(":scope > article[id]")); }
  function withFiles(f) { return !!(window.collabFiles && window.collabFiles.count(f)); } // files.js's chips
  function streaming(a) { return a.getAttribute("data-status") === "streaming"; }

  // #thread-live's articles: into the open thread's list (in place of its copy), kept
  // while streaming, else dropped.
  function deal() {
    var live = holder(), el = list(), t = openThread();
    if (!live) return;
    children(live).forEach(function (a) {
      if (el && a.getAttribute("data-thread") === t) {
        var old = el.querySelector(":scope > #" + CSS.escape(a.id));
        if (old) old.replaceWith(a); else el.appendChild(a);
      } else if (!streaming(a)) {
        a.remove();
      }
    });
  }

  // One article per id, in seq order.
  function tidy(el) {
    var seen = {};
    children(el).forEach(function (a) {
      if (seen[a.id] && seen[a.id] !== a) seen[a.id].replaceWith(a);
      seen[a.id] = a;
    });
    var all = children(el), sorted = all.slice().sort(function (a, b) { return seqOf(a) - seqOf(b); });
    for (var i = 0; i < sorted.length; i++) {
      if (sorted[i] !== all[i]) { sorted.forEach(function (a) { el.appendChild(a); }); break; }
    }
  }
  function render() {
    scheduled = false;
    deal();
    var el = list();
    if (!el) return;
    var near = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
    tidy(el);
    var stream = window.collabStream;
    if (stream) {
      el.querySelectorAll("article[data-status=streaming]").forEach(function (a) {
        var s = stream.state(a);
        if (s) stream.render(s);
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
  }
  function opened() {
    show(true);
    deal(); // the thread's streaming replies as this page has them, in place of the stored text
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
    var t = openThread(), el = list(), live = holder();
    // Its replies still streaming go back where their pieces keep finding them.
    if (el && live) el.querySelectorAll(":scope > article[data-status=streaming]").forEach(function (a) { live.appendChild(a); });
    show(false);
    panel().textContent = "";
    pending = null;
    var back = t && doc.querySelector("#msg-" + t + "-thread button, #msg-" + t + " .act.thread");
    if (back) back.focus();
  }

  doc.addEventListener("htmx:beforeSwap", function (e) {
    // Opening another thread: the one open gives its streaming replies back first.
    if (e.detail && e.detail.target && e.detail.target.id === "thread" && openThread()) {
      var el = list(), live = holder();
      if (el && live) el.querySelectorAll(":scope > article[data-status=streaming]").forEach(function (a) { live.appendChild(a); });
    }
  });
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
    var f = box(), p = panel();
    if (e.key === "Escape" && p && !p.hidden && p.contains(e.target)) { close(); return; }
    if (!f || e.target !== f.text) return;
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      if (f.text.value.trim() || withFiles(f)) f.requestSubmit();
    }
  });
  doc.addEventListener("htmx:wsConfigSend", function (e) {
    var f = box();
    if (!f || e.target !== f) return;
    var params = e.detail.parameters, text = String(params.text || "").trim();
    if (!text && !withFiles(f)) { e.preventDefault(); return; } // files.js: files go without text
    params.thread = Number(f.getAttribute("data-thread"));
    pending = String(params.client_id).toLowerCase();
  });

  // After a snapshot (a reconnect): its #thread-live holds the replies streaming in
  // threads; the open list is read again for what was posted while the page was away,
  // keeping the streaming articles it has (their pieces continue them).
  function reread(t) {
    fetch("t/" + t + "/", { credentials: "same-origin" }).then(function (r) { return r.ok ? r.text() : null; }).then(function (html) {
      var el = list();
      if (!html || !el || openThread() !== t) return;
      var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("thread-" + t + "-list");
      if (!fresh) return;
      children(fresh).forEach(function (a) {
        var old = el.querySelector(":scope > #" + CSS.escape(a.id));
        if (old && streaming(old) && streaming(a)) return; // its pieces continue ours (an ended one: the stored)
        var node = doc.importNode(a, true);
        if (old) old.replaceWith(node); else el.appendChild(node);
        if (window.htmx) htmx.process(node);
      });
      schedule();
    });
  }
  doc.addEventListener("htmx:oobAfterSwap", function (e) {
    var t = e.detail && e.detail.target;
    if (!t || t.id !== "thread-live") return;
    deal(); // at once: no two articles of one id wait for the next frame
    schedule();
  });
  doc.addEventListener("htmx:wsAfterMessage", function (e) {
    var text = e.detail && e.detail.message;
    if (typeof text === "string" && text.indexOf('<div id="thread-live" hidden') !== -1 && openThread()) reread(openThread());
    schedule();
  });

  // A search result in a thread links to the room with ?thread=ID: open it.
  doc.addEventListener("DOMContentLoaded", function () {
    var t = new URLSearchParams(location.search).get("thread");
    if (t && /^[0-9]+$/.test(t) && window.htmx && panel()) htmx.ajax("GET", "t/" + t + "/", { target: "#thread", swap: "innerHTML" });
  });
})();
