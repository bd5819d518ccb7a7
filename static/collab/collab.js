// The room page, on top of htmx and its ws extension (which swap what the server sends).
// Hand-written, no build step, no dependency (stream.js, loaded first, is ours too). The
// buttons and messages it adds come from <template>s in templates/chat/room.html (it only
// wraps text and code blocks in plain elements); model text only ever goes in as text.
//
// - The box: Enter sends, Shift+Enter breaks the line, @ completes assistant handles; it
//   is cleared only once the server has the message (its article arrives with our
//   client_id), a length counter near the limit, nothing sent over it. Its files are
//   files.js's: with files attached, the text may be empty.
// - Streaming replies (formatted by stream.js): updated at most once per animation frame.
// - Following the end unless the reader scrolled up ("new messages" button, in a row of its
//   own); sending always brings the reader back to the end; errors that can be dismissed
//   and fade; copy buttons on code blocks; the member list's, the lens's and a message's
//   actions' buttons; a live region that says when a reply starts and ends; reconnecting
//   after a drop.
// - The room's state: a locked or archived room, or a member removed, shows its banner and
//   every control that would be refused is disabled, live as the state changes.
(function () {
  "use strict";
  var doc = document;
  var stats = (window.collabStats = { frames: 0, ms: 0, maxMs: 0 });
  var TERMINAL = { "room.removed": 1, "room.closed": 1, "session.ended": 1, "room.banned": 1 };
  var ERROR_MS = 8000;
  var MAX_ERRORS = 3;

  function byId(id) { return doc.getElementById(id); }
  function fromTemplate(id) {
    var t = byId(id);
    return t ? t.content.firstElementChild.cloneNode(true) : null;
  }
  function uuid4() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    var b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 15) | 64; b[8] = (b[8] & 63) | 128;
    var h = Array.prototype.map.call(b, function (x) { return (x + 256).toString(16).slice(1); }).join("");
    return h.slice(0, 8) + "-" + h.slice(8, 12) + "-" + h.slice(12, 16) + "-" + h.slice(16, 20) + "-" + h.slice(20);
  }
  window.collabIds = { uuid4: uuid4 }; // threads.js's posts too
  function withFiles(f) { return !!(window.collabFiles && window.collabFiles.count(f)); } // files.js's chips
  function count(text) { return Array.from(text).length; } // characters, as the server counts them
  function number(n) { return n.toLocaleString("en-US"); }

  // --- saying things: the connection, errors, the live region -----------------------------------
  function setConn(text, cls) {
    var el = byId("conn");
    if (el) { el.textContent = text; el.className = "conn " + (cls || ""); }
  }
  function announce(text) {
    var el = byId("announcer");
    if (el) el.textContent = text;
  }
  function showError(code, text) {
    var errors = byId("errors"), p = fromTemplate("error-template");
    if (!errors || !p) return;
    p.setAttribute("data-code", code);
    p.textContent = text;
    errors.appendChild(p); // decorated by the observer, like the server's
  }
  function dropError(p) {
    if (!p.parentNode) return;
    p.classList.add("fading");
    setTimeout(function () { if (p.parentNode) p.parentNode.removeChild(p); }, 400);
  }
  function decorateError(p) {
    if (p.querySelector(".dismiss")) return;
    var text = doc.createElement("span");
    text.className = "text";
    while (p.firstChild) text.appendChild(p.firstChild);
    p.appendChild(text);
    var close = fromTemplate("dismiss-template");
    if (close) p.appendChild(close);
    if (TERMINAL[p.getAttribute("data-code")]) { leave(text.textContent); return; } // why the page stopped: it stays
    var fade = function () {
      if (p.contains(doc.activeElement)) setTimeout(fade, 2000); // not while its button has the focus
      else dropError(p);
    };
    setTimeout(fade, ERROR_MS);
  }
  function watchErrors() {
    var errors = byId("errors");
    if (!errors) return;
    new MutationObserver(function () {
      var all = errors.querySelectorAll(".error, .notice");
      all.forEach(decorateError);
      for (var i = 0; i < all.length - MAX_ERRORS; i++) all[i].parentNode.removeChild(all[i]);
    }).observe(errors, { childList: true });
  }

  // --- the box ------------------------------------------------------------------------------------
  var pending = null; // {id, text}: sent, not yet seen in the room
  function form() { return byId("composer"); }
  function maxChars() { var f = form(); return f ? Number(f.getAttribute("data-max")) || 8000 : 8000; }
  function updateCounter() {
    var f = form(), counter = byId("counter");
    if (!f || !counter) return;
    var n = count(f.text.value.trim()), max = maxChars(), over = n > max;
    counter.hidden = n < max * 0.9;
    counter.textContent = number(n) + " / " + number(max);
    counter.classList.toggle("over", over);
    if (over) f.text.setAttribute("aria-invalid", "true");
    else f.text.removeAttribute("aria-invalid");
  }
  function accepted() {
    // Our message is in the room: empty the box (unless something new was typed since).
    var f = form();
    if (!pending || !f) return;
    var mine = doc.querySelector('#messages article[data-client-id="' + pending.id + '"]');
    if (!mine) return;
    if (f.text.value.trim() === pending.text) f.text.value = "";
    follow();
    f.client_id.value = uuid4();
    pending = null;
    updateCounter();
  }
  doc.addEventListener("htmx:wsConfigSend", function (e) {
    var f = form();
    if (!f || e.target !== f) return;
    var params = e.detail.parameters, text = String(params.text || "").trim(), n = count(text), max = maxChars();
    if (!text && !withFiles(f)) { e.preventDefault(); return; } // files.js: files go without text
    if (n > max) {
      e.preventDefault();
      showError("message.too_long", "A message is at most " + number(max) + " characters; this one has " + number(n) + ". Shorten it, then send it again.");
      return;
    }
    if (pending && pending.text !== text) { // an edit of a refused message is a new message
      f.client_id.value = uuid4();
      params.client_id = f.client_id.value;
    }
    pending = { id: String(params.client_id).toLowerCase(), text: text };
    follow(); // whatever the reader was reading, their message and its replies are what they want next
  });

  // A button that asks first (Delete): nothing is sent unless the reader agrees.
  doc.addEventListener("htmx:wsConfigSend", function (e) {
    var ask = e.target.getAttribute && e.target.getAttribute("data-confirm");
    if (ask && !window.confirm(ask)) e.preventDefault();
  });

  // @ completion: a listbox of the room's assistants under the caret's @word.
  var mention = { open: false, index: 0 };
  function options() {
    var list = byId("mentions");
    return list ? Array.prototype.filter.call(list.children, function (li) { return !li.hidden; }) : [];
  }
  function mentionWord(box) {
    var m = /(^|[^\w@])@([A-Za-z0-9_-]{0,32})$/.exec(box.value.slice(0, box.selectionStart));
    return m && box.selectionStart === box.selectionEnd ? m[2] : null;
  }
  function closeMentions() {
    var list = byId("mentions"), f = form();
    if (list) list.hidden = true;
    if (f) f.text.removeAttribute("aria-activedescendant");
    mention.open = false;
  }
  function highlight(i) {
    var shown = options(), f = form();
    mention.index = (i + shown.length) % shown.length;
    shown.forEach(function (li, k) { li.setAttribute("aria-selected", k === mention.index ? "true" : "false"); });
    f.text.setAttribute("aria-activedescendant", shown[mention.index].id);
    shown[mention.index].scrollIntoView({ block: "nearest" });
  }
  function updateMentions() {
    var f = form(), list = byId("mentions");
    if (!f || !list) return;
    var word = mentionWord(f.text);
    if (word === null) { closeMentions(); return; }
    word = word.toLowerCase();
    var any = false;
    Array.prototype.forEach.call(list.children, function (li) {
      li.hidden = li.getAttribute("data-handle").toLowerCase().indexOf(word) !== 0;
      any = any || !li.hidden;
    });
    if (!any) { closeMentions(); return; }
    list.hidden = false;
    mention.open = true;
    highlight(0);
  }
  function pick(li) {
    var box = form().text, caret = box.selectionStart, before = box.value.slice(0, caret);
    var start = before.lastIndexOf("@"), insert = "@" + li.getAttribute("data-handle") + " ";
    box.value = before.slice(0, start) + insert + box.value.slice(caret);
    box.selectionStart = box.selectionEnd = start + insert.length;
    closeMentions();
    updateCounter();
  }
  function onKey(e) {
    var f = form();
    if (mention.open) {
      var shown = options();
      if (e.key === "ArrowDown" || e.key === "ArrowUp") {
        e.preventDefault();
        highlight(mention.index + (e.key === "ArrowDown" ? 1 : -1));
        return;
      }
      if ((e.key === "Enter" && !e.shiftKey) || (e.key === "Tab" && !e.shiftKey)) {
        e.preventDefault();
        pick(shown[mention.index]);
        return;
      }
      if (e.key === "Escape") { e.preventDefault(); closeMentions(); return; }
    }
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      if (f.text.value.trim() || withFiles(f)) f.requestSubmit();
    }
  }
  var sock = null, typing = window.collabTyping;
  function setUpComposer() {
    var f = form(), list = byId("mentions");
    if (!f) return; // staff viewing read-only: no box
    f.client_id.value = uuid4();
    f.text.addEventListener("keydown", onKey);
    f.text.addEventListener("input", function () { updateCounter(); updateMentions(); if (f.text.value.trim()) typing.typed(sock); });
    f.text.addEventListener("click", updateMentions);
    f.text.addEventListener("blur", closeMentions);
    if (list) {
      list.addEventListener("mousedown", function (e) { e.preventDefault(); }); // keep the box focused
      list.addEventListener("click", function (e) { var li = e.target.closest("li"); if (li) pick(li); });
    }
    updateCounter();
    // A rename arrives as a new #room-name (rendering.room_name): the box's placeholder follows it.
    var title = byId("room-name"), placeholder = f.text.getAttribute("placeholder") || "";
    if (title && title.parentNode) {
      var shown = title.textContent;
      new MutationObserver(function () {
        var now = byId("room-name");
        if (!now || now.textContent === shown) return;
        placeholder = placeholder.replace("Message " + shown, "Message " + now.textContent);
        shown = now.textContent;
        f.text.setAttribute("placeholder", placeholder);
      }).observe(title.parentNode, {childList: true});
    }
  }

  // --- streaming replies: stream.js formats them -------------------------------------------------
  var liveState = window.collabStream.state, renderLive = window.collabStream.render;
  var streaming = [];

  // --- what changed since the last frame ----------------------------------------------------------
  var statuses = new Map(), scanned = false;
  function name(article) { return article.getAttribute("data-author") || "An assistant"; }
  // A shared personal reply arrives appended (docs/wire.md, "share"): its recipient's own
  // copy is replaced where it stands, and every page puts it at its seq among the others
  // (a reply's later version at its slot's, data-slot-seq: docs/wire.md, "show a version").
  function seqOf(a) { return Number(a.getAttribute("data-slot-seq") || a.getAttribute("data-seq")); }
  function placeBySeq(list) {
    var seen = {};
    list.querySelectorAll(":scope > article[data-seq]").forEach(function (a) {
      var first = seen[a.id];
      if (first && first !== a) { first.replaceWith(a); }
      seen[a.id] = a;
    });
    var last = -1;
    list.querySelectorAll(":scope > article[data-seq]").forEach(function (a) {
      var seq = seqOf(a);
      if (seq >= last) { last = seq; return; }
      var after = Array.prototype.find.call(list.querySelectorAll(":scope > article[data-seq]"), function (b) {
        return seqOf(b) > seq;
      });
      if (after && after !== a) list.insertBefore(a, after);
    });
  }
  function scan() {
    var list = byId("messages");
    if (!list) return;
    placeBySeq(list);
    var said = [];
    streaming = [];
    list.querySelectorAll("article[data-role=assistant]").forEach(function (a) {
      var status = a.getAttribute("data-status"), before = statuses.get(a.id);
      if (status === "streaming") {
        var s = liveState(a);
        if (s) streaming.push(s);
        if (before === undefined && scanned) said.push(name(a) + " is replying.");
      } else if (before === "streaming") {
        said.push(name(a) + (status === "done" ? " finished." : " " + status + "."));
      }
      statuses.set(a.id, status);
    });
    list.querySelectorAll(".body.md pre:not([data-copy])").forEach(function (pre) {
      pre.setAttribute("data-copy", "1");
      pre.tabIndex = 0;  // a code block wider than the column scrolls: by keyboard too (axe)
      var wrap = doc.createElement("div"), button = fromTemplate("copy-template");
      wrap.className = "code";
      pre.parentNode.insertBefore(wrap, pre);
      wrap.appendChild(pre);
      if (button) wrap.appendChild(button);
    });
    if (said.length) announce(said.join(" "));
    scanned = true;
    accepted();
  }

  // Following the end of the list, unless the reader scrolled up. While they read above,
  // the browser's scroll anchoring keeps what they read in place when a reply above grows;
  // while following, it is off, so that the end stays in view.
  var following = true, lastTop = 0;
  function nearBottom(el) { return el.scrollHeight - el.scrollTop - el.clientHeight < 40; }
  function setFollowing(on) {
    following = on;
    var list = byId("messages");
    if (list) list.style.overflowAnchor = on ? "none" : "auto";
  }
  function toBottom(list) {
    var pill = byId("new-below");
    if (pill) pill.hidden = true; // first: the list takes its row back before it is scrolled
    list.scrollTop = list.scrollHeight;
    lastTop = list.scrollTop;
    setFollowing(true);
  }
  function follow() {
    var list = byId("messages");
    if (list) toBottom(list);
    schedule(); // and again once the new articles are in
  }
  doc.addEventListener("scroll", function (e) {
    var list = byId("messages");
    if (e.target !== list) return;
    // The reader went up (not the browser clamping a list that grew taller at its end).
    if (list.scrollTop < lastTop - 2 && !nearBottom(list)) setFollowing(false);
    else if (nearBottom(list)) toBottom(list);
    lastTop = list.scrollTop;
  }, true);

  var dirty = { structure: false, text: false }, scheduled = false;
  function schedule() {
    if (!scheduled) { scheduled = true; requestAnimationFrame(frame); }
  }
  function frame() {
    scheduled = false;
    var t0 = performance.now(), grew = dirty.structure;
    if (dirty.structure) scan();
    if (dirty.structure || dirty.text) {
      streaming = streaming.filter(function (s) { return s.body.isConnected; });
      streaming.forEach(function (s) { grew = renderLive(s) || grew; });
    }
    dirty.structure = dirty.text = false;
    var list = byId("messages");
    if (list && grew) {
      if (following) toBottom(list);
      else { var pill = byId("new-below"); if (pill) pill.hidden = false; }
    }
    var ms = performance.now() - t0;
    stats.frames++; stats.ms += ms; if (ms > stats.maxMs) stats.maxMs = ms;
  }
  doc.addEventListener("htmx:wsAfterMessage", function (e) {
    var text = e.detail && e.detail.message;
    if (typeof text !== "string" || text.indexOf("<article") !== -1 || text.indexOf('id="messages"') !== -1) dirty.structure = true;
    if (typeof text === "string" && text.indexOf("<article") !== -1) typing.done(text);
    if (typeof text !== "string" || text.indexOf('id="room-status"') !== -1 || text.indexOf("<article") !== -1) applyState();
    dirty.text = true;
    schedule();
  });
  // "show all" and "older messages" bring articles over HTTP.
  doc.addEventListener("htmx:afterSettle", function () { dirty.structure = true; schedule(); });

  // Waiting for the first token: seconds since the reply was asked for, beside its state.
  function tick() {
    var now = Date.now() / 1000;
    streaming.forEach(function (s) {
      var el = s.article.querySelector(".elapsed");
      if (!el || s.text) return;
      var since = Number(el.getAttribute("data-since")) || now, secs = Math.floor(now - since);
      if (secs < 0 || secs > 86400) { el.setAttribute("data-since", String(now)); secs = 0; } // another clock
      el.textContent = secs >= 1 ? secs + " s" : "";
    });
  }

  // --- clicks: copy, the member list, the "new messages" button -------------------------------------
  function copied(button) {
    button.textContent = "Copied";
    announce("Copied.");
    setTimeout(function () { button.textContent = "Copy"; }, 2000);
  }
  function copyByHand(button, pre) {
    var range = doc.createRange(), selection = window.getSelection();
    range.selectNodeContents(pre);
    selection.removeAllRanges();
    selection.addRange(range);
    var done = false;
    try { done = doc.execCommand("copy"); } catch (err) { done = false; }
    if (done) copied(button);
    else { button.textContent = "Press Ctrl+C"; announce("The code is selected: press Control C to copy it."); }
  }
  doc.addEventListener("click", function (e) {
    var skip = e.target.closest && e.target.closest("a.skip"), f = form();
    if (skip && f) { e.preventDefault(); f.text.focus(); return; }
    var t = e.target.closest && e.target.closest("button");
    if (!t) return;
    if (t.classList.contains("copy")) {
      var pre = t.parentNode.querySelector("pre"), text = pre.textContent;
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(function () { copied(t); }, function () { copyByHand(t, pre); });
      } else copyByHand(t, pre);
    } else if (t.classList.contains("dismiss")) {
      dropError(t.closest(".error, .notice"));
      var f = form();
      if (f) f.text.focus();
    } else if (t.id === "side-toggle") {
      var open = t.closest(".room").classList.toggle("show-side");
      t.setAttribute("aria-expanded", open ? "true" : "false");
    } else if (t.id === "new-below") {
      var list = byId("messages");
      if (list) toBottom(list);
    } else if (t.id === "lens-toggle") {
      var shown = t.closest(".room").classList.toggle("show-lens");
      t.setAttribute("aria-expanded", shown ? "true" : "false");
      if (shown) { var box = byId("lens-box"); if (box) box.focus(); }
    } else if (t.classList.contains("more")) {
      var article = t.closest("article"), opened = article.classList.toggle("tools-open");
      t.setAttribute("aria-expanded", opened ? "true" : "false");
    }
  });

  // --- the room's state: what this member may still do here ------------------------------------------
  var gone = false;
  var STATES = { locked: 1, archived: 1 };
  function disable(root, off) {
    if (!root) return;
    root.querySelectorAll("textarea, input:not([type=hidden]), button").forEach(function (el) { el.disabled = off; });
  }
  function applyState() {
    var room = doc.querySelector(".room"), banner = byId("room-status");
    if (!room || !banner) return;
    var closed = !gone && !!STATES[banner.getAttribute("data-status")];
    if (closed) room.setAttribute("data-closed", banner.getAttribute("data-status"));
    else room.removeAttribute("data-closed");
    disable(form(), closed || gone);
    if (gone) {
      disable(byId("lens"), true);
      disable(byId("messages"), true);
    }
  }
  function leave(text) {
    // Removed, banned, or the session ended: nothing this page sends would be taken.
    gone = true;
    var room = doc.querySelector(".room"), banner = byId("room-status");
    if (room) room.setAttribute("data-gone", "1");
    if (banner) { banner.setAttribute("data-status", "gone"); banner.textContent = text; }
    applyState();
  }

  // --- the socket -----------------------------------------------------------------------------------
  // After a drop: full jitter, random() * min(8000, 500 * 2^retries) ms, at least 100 ms,
  // so that a storm of pages spreads out (docs/wire.md, "Close codes the server sends").
  // `retries`: attempts since the last open (the extension's count after 1006 and the like;
  // the page's own, `drops`, after 4408 and 4503). The load generator copies it.
  function backoff(retries) {
    return Math.max(100, Math.random() * Math.min(8000, 500 * Math.pow(2, retries)));
  }
  // 4429 "come back later", reason "retry=MS": wait MS + random() * MS (docs/wire.md).
  function hinted(reason) {
    var m = /^retry=(\d+)$/.exec(reason || "");
    return m ? Number(m[1]) * (1 + Math.random()) : null;
  }
  var drops = 0;
  window.collabConn = { backoff: backoff, hinted: hinted };
  if (window.htmx) htmx.config.wsReconnectDelay = backoff;
  doc.addEventListener("htmx:wsOpen", function (e) {
    sock = e.detail && e.detail.socketWrapper;
    setConn("live", "ok");
    var errors = byId("errors");
    if (errors) errors.textContent = "";
  });
  // The snapshot (the first frame) came: the next drop starts the back-off over.
  doc.addEventListener("htmx:wsAfterMessage", function () { drops = 0; });
  doc.addEventListener("htmx:wsClose", function (e) {
    sock = null;
    var event = e.detail && e.detail.event, code = event ? event.code : 0;
    var again = e.detail && e.detail.socketWrapper;
    // The extension reconnects by itself only after 1006, 1011, 1012 and 1013: these codes
    // are the page's own, one reconnect each.
    if (code === 4429 || code === 4408 || code === 4503) {
      // 4429: this process takes no socket now (too many connecting, or shutting down);
      // 4408: this page fell too far behind the room; 4503: the server could not resync it.
      // Connect again (after the hint, if any) and resume from a fresh snapshot.
      setConn("reconnecting…", "warn");
      var delay = code === 4429 ? hinted(event.reason) : null;
      if (delay === null) delay = backoff(drops++);
      if (again) setTimeout(function () { again.reconnect(); }, delay);
    } else if (code === 4403) {
      setConn("no access to this room", "bad");
      if (!gone) leave("You no longer have access to this room: you can read what is here, but nothing you do is sent.");
    } else {
      setConn("reconnecting…", "warn"); // the extension reconnects by itself (1006, 1011, 1012, 1013)
    }
  });

  doc.addEventListener("DOMContentLoaded", function () {
    var list = byId("messages");
    if (!list) return;
    watchErrors();
    typing.watch();
    setUpComposer();
    scan();
    streaming.forEach(renderLive);
    toBottom(list);
    applyState();
    setInterval(tick, 1000);
  });
})();
