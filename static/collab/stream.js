// Streaming replies, lightly formatted, for collab.js. The server appends a reply's raw
// text to #msg-N-body (the wire contract: other clients and tests read it there); beside
// it this keeps a formatted view (paragraphs, headings, lists, code blocks, bold, inline
// code) and hides the raw text. Each update reads only the text nodes added since the
// last one and rebuilds only the last block, the one still growing: the blocks before it
// are done. Model text only ever goes in as text (textContent), never as HTML.
(function () {
  "use strict";
  var doc = document;

  // Blocks of Markdown-ish text from `start` (the start of a block, outside code).
  function parse(text, start) {
    var blocks = [], cur = null, pos = start, n = text.length, m;
    while (pos < n) {
      var nl = text.indexOf("\n", pos), end = nl < 0 ? n : nl, line = text.slice(pos, end), at = pos;
      pos = nl < 0 ? n : nl + 1;
      if (cur && cur.kind === "pre") {
        if (/^\s*```\s*$/.test(line)) cur = null;
        else cur.lines.push(line);
        continue;
      }
      if ((m = /^\s*```/.exec(line))) { cur = { kind: "pre", start: at, lines: [] }; blocks.push(cur); continue; }
      if (!line.trim()) { cur = null; continue; }
      if ((m = /^(#{1,6})\s+(.*)$/.exec(line))) { cur = null; blocks.push({ kind: "h" + m[1].length, start: at, lines: [m[2]] }); continue; }
      if ((m = /^\s*([-*+]|\d+[.)])\s+(.*)$/.exec(line))) {
        var kind = /\d/.test(m[1]) ? "ol" : "ul";
        if (!cur || cur.kind !== kind) { cur = { kind: kind, start: at, lines: [] }; blocks.push(cur); }
        cur.lines.push(m[2]);
        continue;
      }
      if (cur && (cur.kind === "p" || ((cur.kind === "ul" || cur.kind === "ol") && /^\s/.test(line)))) {
        cur.lines[cur.lines.length - 1] += "\n" + line;
        continue;
      }
      cur = { kind: "p", start: at, lines: [line] };
      blocks.push(cur);
    }
    return blocks;
  }
  var STEER_MARK = "\u21aa steered by ";
  var INLINE = /`([^`\n]+)`|\*\*([^*\n]+)\*\*/g;
  function inline(el, text) {
    el.textContent = "";
    var last = 0, m;
    INLINE.lastIndex = 0;
    while ((m = INLINE.exec(text))) {
      if (m.index > last) el.appendChild(doc.createTextNode(text.slice(last, m.index)));
      var span = doc.createElement(m[1] !== undefined ? "code" : "strong");
      span.textContent = m[1] !== undefined ? m[1] : m[2];
      el.appendChild(span);
      last = INLINE.lastIndex;
    }
    if (last < text.length) el.appendChild(doc.createTextNode(text.slice(last)));
  }
  function fill(el, block) {
    if (block.kind === "pre") {
      var code = el.firstChild || el.appendChild(doc.createElement("code"));
      code.textContent = block.lines.join("\n");
    } else if (block.kind === "ul" || block.kind === "ol") {
      block.lines.forEach(function (line, i) {
        var li = el.children[i] || el.appendChild(doc.createElement("li"));
        if (li.getAttribute("data-src") !== line) { li.setAttribute("data-src", line); inline(li, line); }
      });
      while (el.children.length > block.lines.length) el.removeChild(el.lastChild);
    } else {
      inline(el, block.lines[0]);
      // A steered reply's marker (steer.js; docs/wire.md, "steer a reply"): a paragraph of its own.
      if (block.kind === "p") el.classList.toggle("steer-mark", block.lines[0].lastIndexOf(STEER_MARK, 0) === 0);
    }
    return el;
  }
  var views = new WeakMap(); // raw body -> its formatted view's state
  function liveState(article) {
    var body = article.querySelector(".body.raw");
    if (!body) return null;
    var s = views.get(body);
    if (!s) {
      var view = doc.createElement("div");
      view.className = "live md";
      body.parentNode.insertBefore(view, body.nextSibling);
      article.classList.add("formatted");
      s = { article: article, body: body, view: view, nodes: 0, text: "", shown: -1, blocks: [], tail: 0 };
      views.set(body, s);
    }
    return s;
  }
  function renderLive(s) {
    var nodes = s.body.childNodes;
    if (nodes.length < s.nodes) { s.nodes = 0; s.text = ""; } // replaced meanwhile: read it again
    for (; s.nodes < nodes.length; s.nodes++) s.text += nodes[s.nodes].textContent;
    if (s.text.length === s.shown) return false;
    s.shown = s.text.length;
    if (s.text && !s.folded) { // the answer has started: fold its thinking (a click opens it again)
      s.folded = true;
      var thinking = s.article.querySelector("details.thinking");
      if (thinking) thinking.open = false;
    }
    // Blocks before the last one are done; parse again from the last one's start.
    var keep = Math.max(0, s.blocks.length - 1);
    var from = s.blocks.length ? s.blocks[keep].start : 0;
    var fresh = parse(s.text, from);
    for (var i = 0; i < fresh.length; i++) {
      var old = s.blocks[keep + i];
      if (old && old.kind === fresh[i].kind) {
        fresh[i].el = old.el;
      } else {
        fresh[i].el = doc.createElement(fresh[i].kind);
        if (old) s.view.replaceChild(fresh[i].el, old.el);
        else s.view.appendChild(fresh[i].el);
      }
      fill(fresh[i].el, fresh[i]);
    }
    for (var k = keep + fresh.length; k < s.blocks.length; k++) s.view.removeChild(s.blocks[k].el);
    s.blocks = s.blocks.slice(0, keep).concat(fresh);
    var elapsed = s.article.querySelector(".elapsed");
    if (elapsed && s.text) elapsed.textContent = "";
    return true;
  }

  window.collabStream = { state: liveState, render: renderLive };
})();
