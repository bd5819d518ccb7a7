// Reactions (collab/chat/commands/reactions.py; docs/wire.md, "react"). A reaction frame
// replaces a message's bar (#msg-N-reactions), the same HTML for every member: this file
// presses the viewer's own emoji (aria-pressed, from each button's data-by and the page's
// data-me) and runs the one emoji picker of the page (templates/chat/_reaction_picker.html):
// "React" opens it, a name search filters the Unicode set (fetched once, on first open),
// arrow keys move in its grid, Enter or a click reacts, Escape closes it.
(function () {
  "use strict";
  var doc = document, sock = null, opener = null, openFor = NaN, refocus = null;
  var catalogue = null, loading = null, MAX_SHOWN = 120, COLUMNS = 8;

  function me() {
    var room = doc.querySelector(".room[data-me]");
    return room ? room.getAttribute("data-me") : "";
  }
  function picker() { return doc.getElementById("reaction-picker"); }

  // --- the viewer's own reactions ----------------------------------------------------------------
  function syncAll() {
    var name = me();
    doc.querySelectorAll("#messages .reactions .reaction").forEach(function (b) {
      var by = (b.getAttribute("data-by") || "").split(" ");
      b.setAttribute("aria-pressed", name && by.indexOf(name) !== -1 ? "true" : "false");
    });
    if (refocus !== null && (doc.activeElement === doc.body || !doc.activeElement)) {
      var again = doc.querySelector("#msg-" + refocus + "-reactions .react-add");
      if (again) again.focus();
      refocus = null;
    }
  }
  doc.addEventListener("htmx:wsOpen", function (e) { sock = e.detail && e.detail.socketWrapper; });
  doc.addEventListener("htmx:wsClose", function () { sock = null; });
  doc.addEventListener("htmx:wsAfterMessage", function (e) {
    var text = e.detail && e.detail.message;
    if (typeof text === "string" && text.indexOf('class="reactions"') !== -1) syncAll();
  });
  doc.addEventListener("htmx:afterSettle", syncAll); // "show all", older messages
  doc.addEventListener("DOMContentLoaded", syncAll);

  // --- the picker --------------------------------------------------------------------------------
  function button(row) {
    var b = doc.createElement("button");
    b.type = "button";
    b.className = "pick";
    b.setAttribute("data-emoji", row[0]);
    b.setAttribute("aria-label", row[1]);
    b.title = row[1];
    b.textContent = row[0];
    return b;
  }
  function load(p) {
    if (catalogue || loading) return loading;
    loading = fetch(p.getAttribute("data-catalogue"), { credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (body) { catalogue = body.emoji; show(); })
      .catch(function () { loading = null; });
    return loading;
  }
  function matches(row, words) {
    var hay = (row[1] + " " + row[2]).toLowerCase();
    return words.every(function (w) { return hay.indexOf(w) !== -1; });
  }
  function show() {
    var p = picker();
    if (!p || !catalogue) return;
    var q = doc.getElementById("reaction-search").value.trim().toLowerCase();
    var words = q ? q.split(/\s+/) : [];
    var rows = [];
    for (var i = 0; i < catalogue.length && rows.length < MAX_SHOWN; i++) {
      if (!words.length || matches(catalogue[i], words)) rows.push(catalogue[i]);
    }
    var grid = doc.getElementById("reaction-grid");
    grid.textContent = "";
    rows.forEach(function (row) { grid.appendChild(button(row)); });
    p.querySelector(".reaction-none").hidden = rows.length > 0;
  }
  function place(p, from) {
    var r = from.getBoundingClientRect(), w = p.offsetWidth, h = p.offsetHeight;
    var left = Math.max(8, Math.min(r.left, window.innerWidth - w - 8));
    var top = r.bottom + 4 + h > window.innerHeight ? Math.max(8, r.top - h - 4) : r.bottom + 4;
    p.style.left = left + "px";
    p.style.top = top + "px";
  }
  function open(from) {
    var p = picker();
    if (!p) return;
    if (opener) close(false);
    opener = from;
    var article = from.closest("article");
    openFor = article ? parseInt(article.id.replace("msg-", ""), 10) : NaN;
    from.setAttribute("aria-expanded", "true");
    p.hidden = false;
    place(p, from);
    var search = doc.getElementById("reaction-search");
    search.value = "";
    load(p);
    show();
    search.focus();
  }
  function close(focusBack) {
    var p = picker();
    if (p) p.hidden = true;
    if (opener) {
      opener.setAttribute("aria-expanded", "false");
      var bar = doc.getElementById("msg-" + openFor + "-reactions");
      if (focusBack && doc.contains(opener)) opener.focus();
      else if (focusBack && bar) bar.querySelector(".react-add").focus(); // its bar was replaced meanwhile
    }
    opener = null;
  }
  function pick(emoji) {
    var id = openFor;
    if (sock && !isNaN(id)) {
      sock.send(JSON.stringify({ action: "react", message_id: id, emoji: emoji }), null);
      refocus = id; // its bar is replaced when the frame comes back: focus its new "React"
    }
    close(true);
  }
  function move(from, key) {
    var all = Array.prototype.slice.call(doc.querySelectorAll("#reaction-grid .pick"));
    var at = all.indexOf(from), to = at;
    if (key === "ArrowRight") to = at + 1;
    else if (key === "ArrowLeft") to = at - 1;
    else if (key === "ArrowDown") to = at + COLUMNS;
    else if (key === "ArrowUp") to = at - COLUMNS;
    else if (key === "Home") to = 0;
    else if (key === "End") to = all.length - 1;
    else return false;
    if (to < 0) doc.getElementById("reaction-search").focus();
    else if (all[Math.min(to, all.length - 1)]) all[Math.min(to, all.length - 1)].focus();
    return true;
  }

  doc.addEventListener("click", function (e) {
    var t = e.target.closest ? e.target : e.target.parentElement;
    var add = t && t.closest(".react-add");
    if (add) { e.preventDefault(); if (opener === add) close(true); else open(add); return; }
    var choice = t && t.closest("#reaction-picker .pick");
    if (choice) { pick(choice.getAttribute("data-emoji")); return; }
    if (opener && !(t && t.closest("#reaction-picker"))) close(false);
  });
  doc.addEventListener("focusout", function (e) { // Tab out of the picker: it closes
    var p = picker(), to = e.relatedTarget;
    if (opener && p && p.contains(e.target) && to && !p.contains(to) && to !== opener) close(false);
  });
  doc.addEventListener("input", function (e) {
    if (e.target.id !== "reaction-search") return;
    var p = picker();
    if (catalogue) show(); else if (p) load(p);
  });
  doc.addEventListener("keydown", function (e) {
    if (!opener || !e.target.closest || !e.target.closest("#reaction-picker")) return;
    if (e.key === "Escape") { e.preventDefault(); close(true); return; }
    if (e.target.id === "reaction-search") {
      if (e.key === "ArrowDown") {
        var first = doc.querySelector("#reaction-grid .pick");
        if (first) { e.preventDefault(); first.focus(); }
      } else if (e.key === "Enter") {
        var only = doc.querySelector("#reaction-grid .pick");
        if (only) { e.preventDefault(); pick(only.getAttribute("data-emoji")); }
      }
      return;
    }
    if (e.target.classList.contains("pick") && move(e.target, e.key)) e.preventDefault();
  });
})();
