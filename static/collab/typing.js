// Typing (docs/wire.md, "typing"), for collab.js: at most one notice every 2 s while the
// member types; the others' notices (#typing) clear after 4 s, or when that member's
// message arrives.
(function () {
  "use strict";
  var doc = document;
  function byId(id) { return doc.getElementById(id); }

  var typedAt = 0, typingTimers = {};
  function typed(sock) { // the member typed in the box (not empty): tell the room, at most every 2 s
    var now = Date.now();
    if (!sock || now - typedAt < 2000) return;
    typedAt = now;
    sock.send(JSON.stringify({ action: "typing" }), null);
  }
  function clearTyping(user) {
    var box = byId("typing");
    if (!box) return;
    box.querySelectorAll(".typing-who").forEach(function (s) {
      if (s.getAttribute("data-user") === user) s.parentNode.removeChild(s);
    });
    clearTimeout(typingTimers[user]);
    delete typingTimers[user];
  }
  function watchTyping() {
    var box = byId("typing");
    if (!box) return;
    new MutationObserver(function (changes) {
      changes.forEach(function (c) {
        Array.prototype.forEach.call(c.addedNodes, function (s) {
          if (!s.getAttribute || !s.classList.contains("typing-who")) return;
          var user = s.getAttribute("data-user");
          box.querySelectorAll(".typing-who").forEach(function (old) {
            if (old !== s && old.getAttribute("data-user") === user) old.parentNode.removeChild(old);
          });
          clearTimeout(typingTimers[user]);
          typingTimers[user] = setTimeout(function () { clearTyping(user); }, 4000);
        });
      });
    }).observe(box, { childList: true });
  }
  function typingDone(text) {
    // A member's message arrived: their notice goes (a reply's article is not theirs).
    Object.keys(typingTimers).forEach(function (user) {
      var at = text.indexOf('data-author="' + user.replace(/&/g, "&amp;").replace(/"/g, "&quot;") + '"');
      if (at === -1) return;
      var start = text.lastIndexOf("<article", at), role = text.indexOf('data-role="user"', start);
      if (start !== -1 && role !== -1 && role < at) clearTyping(user);
    });
  }

  window.collabTyping = { typed: typed, watch: watchTyping, done: typingDone };
})();
