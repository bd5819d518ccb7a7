// Files in the composer (docs/wire.md, "Files" and "post"), and the lightbox for images in
// messages. Hand-written, no build step; every element it adds comes from a <template> in
// templates/chat/room.html.
//
// - A composer that takes files is a form with data-upload-url (the room's box, and a
//   thread's). Files come by its Attach button (a hidden <input type=file multiple>), by
//   drag and drop anywhere on the room (its drop zone shows while files are dragged over
//   the page; a drop on the open thread goes to the thread's box), and by pasting images
//   into the box.
// - Each file uploads at once, alone, over HTTP (XMLHttpRequest: its upload progress),
//   as a chip with a progress bar, its name and size, a preview for images, a remove
//   button (which aborts an upload in progress) and the server's refusal in words. The
//   limits (data-max-files, -file-bytes, -message-bytes) are checked here first, so that
//   nobody waits for an upload the server would refuse anyway.
// - Sending: refused while a file uploads or one was refused (say so, send nothing);
//   otherwise the post carries `files`, the ids in the chips' order, a JSON array of ints;
//   the text may then be empty. The chips go once our message is in the room (its article
//   with our client_id), as the text does (collab.js): a refused post keeps them.
// - The lightbox: a click on a[data-lightbox] (an image in a message, by the attachment
//   markup of docs/wire.md) shows the link's image in a modal <dialog>; Escape or a click
//   closes it. Without this script the link opens the image.
(function () {
  "use strict";
  var doc = document;
  var boxes = new WeakMap(); // form -> {items: [item], sent: [{client, items}]}

  function byId(id) { return doc.getElementById(id); }
  function fromTemplate(id) {
    var t = byId(id);
    return t ? t.content.firstElementChild.cloneNode(true) : null;
  }
  function composerOf(el) { return el && el.closest ? el.closest("form[data-upload-url]") : null; }
  function stateOf(f) {
    var s = boxes.get(f);
    if (!s) { s = { items: [], sent: [] }; boxes.set(f, s); }
    return s;
  }
  function limit(f, name) { return Number(f.getAttribute("data-max-" + name)) || Infinity; }
  function size(n) {
    if (n < 1024) return n + " B";
    if (n < 1024 * 1024) return Math.round(n / 1024) + " KB";
    var mb = n / (1024 * 1024);
    return (mb < 10 ? mb.toFixed(1) : Math.round(mb)) + " MB";
  }
  function csrf() {
    // The page's token (base.html's hx-headers), else the cookie's.
    try {
      var h = JSON.parse(doc.body.getAttribute("hx-headers") || "{}");
      if (h["X-CSRFToken"]) return h["X-CSRFToken"];
    } catch (err) { /* fall through to the cookie */ }
    var m = /(?:^|;\s*)csrftoken=([^;]+)/.exec(doc.cookie);
    return m ? decodeURIComponent(m[1]) : "";
  }
  // The box's word on its files (a polite live region): a warning (a refusal, a send
  // that waits) stays until the member acts, over news such as "attached". Shown only
  // when it says what no chip shows (collab.css); heard always.
  function say(f, text, warn) {
    var el = f.querySelector(".file-status");
    if (!el || (!warn && text && el.hasAttribute("data-warn"))) return;
    el.textContent = text;
    if (warn) el.setAttribute("data-warn", warn); else el.removeAttribute("data-warn");
  }
  function unwarn(f) { var el = f.querySelector(".file-status"); if (el) el.removeAttribute("data-warn"); }
  function uploading(item) { return item.state === "uploading" || item.state === "processing"; }

  // --- the chips ------------------------------------------------------------------------------------
  function kindLabel(file) {
    var ext = /\.([A-Za-z0-9]{1,5})$/.exec(file.name || "");
    return ext ? ext[1].toUpperCase() : (file.type.split("/")[1] || "FILE").toUpperCase().slice(0, 5);
  }
  function chipFor(f, item) {
    var chip = fromTemplate("file-chip-template");
    var file = item.file, name = file.name || "pasted file";
    chip.querySelector(".file-name").textContent = name;
    chip.querySelector(".file-name").title = name;
    chip.querySelector(".file-size").textContent = size(file.size);
    chip.querySelector(".file-progress").setAttribute("aria-label", "Uploading " + name);
    chip.querySelector(".file-remove").setAttribute("aria-label", "Remove " + name);
    var img = chip.querySelector(".file-preview img"), label = chip.querySelector(".file-kind");
    if (/^image\//.test(file.type) && window.URL && URL.createObjectURL) {
      item.url = URL.createObjectURL(file); // revoked when the chip goes
      img.addEventListener("error", function () { img.hidden = true; label.hidden = false; }); // a type this browser cannot show
      img.src = item.url;
      img.hidden = false;
      label.hidden = true;
    } else {
      label.textContent = kindLabel(file);
    }
    f.querySelector(".file-chips").appendChild(chip);
    return chip;
  }
  function setState(item, state) {
    item.state = state;
    item.chip.setAttribute("data-state", state);
  }
  function fail(f, item, message) {
    setState(item, "error");
    item.error = message;
    item.chip.querySelector(".file-error").textContent = message;
    item.chip.querySelector(".file-progress").hidden = true;
    say(f, (item.file.name || "The file") + ": " + message, "chip");
    refresh(f);
  }
  function done(f, item, body) {
    item.id = body.id;
    setState(item, "done");
    var bar = item.chip.querySelector(".file-progress");
    bar.value = bar.max;
    bar.setAttribute("aria-label", (item.file.name || "The file") + " uploaded");
    var status = f.querySelector(".file-status");
    if (status && status.getAttribute("data-warn") === "wait" && !stateOf(f).items.some(uploading)) unwarn(f); // it may go now
    say(f, (body.name || item.file.name) + " is attached.");
    refresh(f);
  }
  function refusal(xhr) {
    var body = null;
    try { body = JSON.parse(xhr.responseText); } catch (err) { body = null; }
    if (body && body.error && body.error.message) return body.error.message;
    if (xhr.status === 413) return "The server refused the file: it is too large.";
    if (xhr.status === 403) return "The server refused the upload (is the page still signed in? Reload it).";
    return "The server refused the file (HTTP " + xhr.status + ").";
  }

  function upload(f, item) {
    var xhr = new XMLHttpRequest(), bar = item.chip.querySelector(".file-progress"), data = new FormData();
    item.xhr = xhr;
    xhr.open("POST", f.getAttribute("data-upload-url"));
    xhr.setRequestHeader("X-CSRFToken", csrf());
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.addEventListener("progress", function (e) {
      if (e.lengthComputable && e.total) bar.value = (e.loaded / e.total) * bar.max * 0.95; // the rest: the server's reading
    });
    xhr.upload.addEventListener("load", function () { if (item.state === "uploading") setState(item, "processing"); });
    xhr.addEventListener("load", function () {
      item.xhr = null;
      var body = null;
      if (xhr.status >= 200 && xhr.status < 300) {
        try { body = JSON.parse(xhr.responseText); } catch (err) { body = null; }
      }
      if (body && typeof body.id === "number") done(f, item, body);
      else fail(f, item, refusal(xhr));
    });
    xhr.addEventListener("error", function () {
      item.xhr = null;
      fail(f, item, "The upload did not get through (the connection dropped?). Remove it and attach it again.");
    });
    data.append("file", item.file, item.file.name || "pasted");
    xhr.send(data);
  }

  function add(f, files) {
    var s = stateOf(f), list = Array.prototype.slice.call(files || []);
    if (!list.length || f.querySelector("textarea").disabled) return;
    var maxFiles = limit(f, "files"), maxBytes = limit(f, "file-bytes"), maxTotal = limit(f, "message-bytes");
    // Past the number a message may carry: said once, no chip for each (a folder's worth).
    var room = Math.max(0, maxFiles - s.items.filter(function (i) { return i.state !== "error"; }).length);
    if (list.length > room) {
      say(f, "A message carries at most " + maxFiles + " files: " + (list.length - room) + " of these " + (list.length - room === 1 ? "was" : "were") + " not attached.", "refused");
      list = list.slice(0, room);
    }
    list.forEach(function (file) {
      var kept = s.items.filter(function (i) { return i.state !== "error"; });
      var total = kept.reduce(function (n, i) { return n + i.file.size; }, 0);
      var item = { file: file, id: null, xhr: null, state: "uploading", error: null, url: null };
      item.chip = chipFor(f, item);
      s.items.push(item);
      if (file.size > maxBytes) fail(f, item, "This file is " + size(file.size) + "; a file may be at most " + size(maxBytes) + ".");
      else if (total + file.size > maxTotal) fail(f, item, "With this one the message's files would be " + size(total + file.size) + "; at most " + size(maxTotal) + " in all.");
      else upload(f, item);
    });
    refresh(f);
  }

  function remove(f, item) {
    var s = stateOf(f), at = s.items.indexOf(item);
    if (item.xhr) { item.xhr.abort(); item.xhr = null; }
    if (item.url) URL.revokeObjectURL(item.url);
    if (item.chip.parentNode) item.chip.parentNode.removeChild(item.chip);
    if (at !== -1) s.items.splice(at, 1);
    refresh(f);
    return at;
  }

  // What the box shows and allows with the chips it has: Send waits for the uploads, the
  // text is optional with files, and the chips' list is shown only with chips in it.
  function refresh(f) {
    var s = stateOf(f), busy = s.items.some(uploading), room = doc.querySelector(".room");
    var closed = room && (room.hasAttribute("data-closed") || room.hasAttribute("data-gone"));
    f.querySelector(".file-chips").hidden = s.items.length === 0;
    f.querySelector("textarea").required = s.items.length === 0;
    f.classList.toggle("uploading", busy);
    f.setAttribute("data-files", String(s.items.length));
    var send = f.querySelector("button[type=submit]");
    if (send) send.disabled = busy || !!closed;
  }

  // Called by collab.js and threads.js: a box with files may be sent without text.
  window.collabFiles = { count: function (f) { return f && boxes.has(f) ? boxes.get(f).items.length : 0; } };

  // --- sending --------------------------------------------------------------------------------------
  // Captured at the document, before collab.js's and threads.js's listeners: a send that
  // must wait stops here, with nothing else done for it.
  doc.addEventListener("htmx:wsConfigSend", function (e) {
    var f = e.target;
    if (!f || !f.matches || !f.matches("form[data-upload-url]")) return;
    var s = stateOf(f), params = e.detail.parameters;
    delete params.files;
    if (!s.items.length) return;
    var why = null;
    var kind = "refused";
    if (s.items.some(uploading)) { why = "Wait a moment: the files are still uploading. Send once they are done."; kind = "wait"; }
    else if (s.items.some(function (i) { return i.state === "error"; })) why = "A file could not be attached: remove it (×) before sending.";
    if (why) {
      e.preventDefault();
      e.stopPropagation();
      say(f, why, kind);
      var first = f.querySelector(".file-chip[data-state=error] .file-remove");
      if (first && !s.items.some(uploading)) first.focus();
      return;
    }
    params.files = s.items.map(function (i) { return i.id; });
  }, true);
  doc.addEventListener("htmx:wsAfterSend", function (e) {
    var f = composerOf(e.target), body = null;
    if (!f || !boxes.has(f)) return;
    try { body = JSON.parse(e.detail.message); } catch (err) { return; }
    if (!body || !Array.isArray(body.files) || !body.files.length) return;
    var s = stateOf(f);
    s.sent.push({
      client: String(body.client_id || "").toLowerCase(),
      items: s.items.filter(function (i) { return body.files.indexOf(i.id) !== -1; }),
    });
  });
  // Our message is in the room (or the thread): its chips go, as its text did.
  function accepted() {
    doc.querySelectorAll("form[data-upload-url]").forEach(function (f) {
      var s = boxes.get(f);
      if (!s || !s.sent.length) return;
      s.sent = s.sent.filter(function (sent) {
        if (!sent.client || !doc.querySelector('article[data-client-id="' + sent.client + '"]')) return true;
        sent.items.forEach(function (i) { remove(f, i); });
        unwarn(f);
        say(f, "");
        return false;
      });
    });
  }
  doc.addEventListener("htmx:wsAfterMessage", function () { requestAnimationFrame(accepted); });
  doc.addEventListener("htmx:oobAfterSwap", function () { requestAnimationFrame(accepted); });

  // --- choosing, dropping, pasting ------------------------------------------------------------------
  doc.addEventListener("click", function (e) {
    var t = e.target.closest && e.target.closest("button.attach-button, button.file-remove");
    var f = composerOf(t);
    if (!t || !f) return;
    if (t.classList.contains("attach-button")) { f.querySelector("input[type=file]").click(); return; }
    var chip = t.closest(".file-chip"), s = stateOf(f);
    var item = s.items.filter(function (i) { return i.chip === chip; })[0];
    if (!item) return;
    var at = remove(f, item), next = s.items[Math.min(at, s.items.length - 1)];
    unwarn(f);
    say(f, (item.file.name || "The file") + " removed.");
    // The focus stays in the chips while there are some, else back to the box.
    if (next) next.chip.querySelector(".file-remove").focus();
    else f.querySelector("textarea").focus();
  });
  doc.addEventListener("change", function (e) {
    var input = e.target, f = composerOf(input);
    if (!f || input.type !== "file") return;
    add(f, input.files);
    input.value = ""; // the same file may be chosen again
    f.querySelector("textarea").focus();
  });
  doc.addEventListener("paste", function (e) {
    // An image pasted into the box (a screenshot); text, even with an image beside it
    // (a spreadsheet's cells), pastes as text.
    var f = composerOf(e.target), data = e.clipboardData;
    if (!f || !data || !data.files || !data.files.length) return;
    if (Array.prototype.indexOf.call(data.types || [], "text/plain") !== -1) return;
    e.preventDefault();
    add(f, data.files);
  });

  var depth = 0; // dragenter/dragleave pairs: children fire them too
  function dragsFiles(e) { return !!(e.dataTransfer && Array.prototype.indexOf.call(e.dataTransfer.types || [], "Files") !== -1); }
  function dropTarget(e) {
    // The open thread's box for a drop on the thread, else the room's.
    var thread = e.target.closest && e.target.closest("#thread");
    var f = thread && thread.querySelector("form[data-upload-url]");
    f = f || doc.querySelector("#composer[data-upload-url]");
    return f && !f.querySelector("textarea").disabled ? f : null;
  }
  function dragging(on, target) {
    doc.body.classList.toggle("dragging-files", on);
    doc.querySelectorAll("form[data-upload-url]").forEach(function (f) { f.classList.toggle("drop-here", on && f === target); });
  }
  doc.addEventListener("dragenter", function (e) {
    if (!dragsFiles(e)) return;
    depth++;
    e.preventDefault();
    dragging(true, dropTarget(e));
  });
  doc.addEventListener("dragover", function (e) {
    if (!dragsFiles(e)) return;
    e.preventDefault(); // a drop here is ours, not the browser's (which would open the file)
    var target = dropTarget(e);
    e.dataTransfer.dropEffect = target ? "copy" : "none";
    dragging(true, target);
  });
  doc.addEventListener("dragleave", function (e) {
    if (!dragsFiles(e)) return;
    depth = Math.max(0, depth - 1);
    if (!depth) dragging(false, null);
  });
  // A drag that ended elsewhere (dropped outside the window) may leave no dragleave for
  // the page: the next move of the pointer over it clears the drop zones.
  doc.addEventListener("mousemove", function () {
    if (depth || doc.body.classList.contains("dragging-files")) { depth = 0; dragging(false, null); }
  });
  doc.addEventListener("drop", function (e) {
    if (!dragsFiles(e)) return;
    e.preventDefault();
    depth = 0;
    var target = dropTarget(e);
    dragging(false, null);
    if (target) { add(target, e.dataTransfer.files); target.querySelector("textarea").focus(); }
  });

  // A thread's box arrives with its panel: its attach button shows as the room's did.
  function enable(root) {
    root.querySelectorAll("form[data-upload-url] .attach, form[data-upload-url] .file-limits").forEach(function (el) { el.hidden = false; });
  }
  doc.addEventListener("htmx:afterSwap", function (e) { if (e.detail && e.detail.target) enable(e.detail.target); });

  // --- the lightbox ---------------------------------------------------------------------------------
  var opener = null;
  doc.addEventListener("click", function (e) {
    var a = e.target.closest && e.target.closest("a[data-lightbox]"), box = byId("lightbox");
    if (!a || !box || typeof box.showModal !== "function") return;
    if (e.button !== 0 || e.ctrlKey || e.metaKey || e.shiftKey || e.altKey) return; // a new tab, as asked
    e.preventDefault();
    var thumb = a.querySelector("img"), name = a.getAttribute("data-name") || (thumb && thumb.alt) || "";
    var img = box.querySelector(".lightbox-image");
    img.src = a.href;
    img.alt = name;
    box.querySelector(".lightbox-name").textContent = name;
    box.querySelector(".lightbox-open").href = a.href;
    opener = a;
    box.showModal();
  });
  doc.addEventListener("DOMContentLoaded", function () {
    enable(doc);
    var box = byId("lightbox");
    if (!box) return;
    // Any click closes it but one on its link (which opens the file itself).
    box.addEventListener("click", function (e) { if (!(e.target.closest && e.target.closest("a"))) box.close(); });
    box.addEventListener("close", function () {
      box.querySelector(".lightbox-image").removeAttribute("src");
      if (opener && opener.isConnected) opener.focus();
      opener = null;
    });
  });
})();
