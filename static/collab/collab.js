// The room page: a fresh client_id per message, Enter to send, follow the stream,
// and say what the socket is doing. Everything else is htmx and its ws extension.
(function () {
  "use strict";
  function uuid4() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    var b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 15) | 64; b[8] = (b[8] & 63) | 128;
    var h = Array.prototype.map.call(b, function (x) { return (x + 256).toString(16).slice(1); }).join("");
    return h.slice(0, 8) + "-" + h.slice(8, 12) + "-" + h.slice(12, 16) + "-" + h.slice(16, 20) + "-" + h.slice(20);
  }
  function composer() { return document.getElementById("composer"); }
  function setConn(text, cls) {
    var el = document.getElementById("conn");
    if (el) { el.textContent = text; el.className = "conn " + (cls || ""); }
  }
  function nearBottom(el) { return el.scrollHeight - el.scrollTop - el.clientHeight < 120; }

  document.addEventListener("DOMContentLoaded", function () {
    var list = document.getElementById("messages");
    if (list) list.scrollTop = list.scrollHeight;
    var form = composer();
    if (!form) return; // staff viewing read-only: no composer
    form.client_id.value = uuid4();
    form.text.addEventListener("keydown", function (e) {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        if (form.text.value.trim()) form.requestSubmit();
      }
    });
  });

  var follow = true;
  document.addEventListener("htmx:wsBeforeMessage", function () {
    var list = document.getElementById("messages");
    follow = list ? nearBottom(list) : false;
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    var list = document.getElementById("messages");
    if (list && follow) list.scrollTop = list.scrollHeight;
  });
  document.addEventListener("htmx:wsAfterSend", function (e) {
    var form = composer();
    if (form && e.detail && e.detail.elt === form) {
      form.text.value = "";
      form.client_id.value = uuid4();
    }
  });
  document.addEventListener("htmx:wsOpen", function () {
    setConn("live", "ok");
    var errors = document.getElementById("errors");
    if (errors) errors.textContent = "";
  });
  document.addEventListener("htmx:wsClose", function (e) {
    var code = e.detail && e.detail.event ? e.detail.event.code : 0;
    if (code === 4408 || code === 4503) {
      // 4408: this page fell too far behind the room; 4503: the server could not resync it.
      // Either way, connect again and resume from a fresh snapshot.
      setConn("reconnecting…", "warn");
      var again = e.detail.socketWrapper;
      if (again) setTimeout(function () { again.reconnect(); }, 500 + Math.random() * 1500);
    } else if (code === 4403) {
      setConn("no access to this room", "bad");
      var form = composer();
      if (form) form.querySelectorAll("textarea,button").forEach(function (el) { el.disabled = true; });
    } else {
      setConn("reconnecting…", "warn");
    }
  });
})();
