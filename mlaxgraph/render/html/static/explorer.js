/* mlaxgraph explorer: draws the graph data embedded in this page (a JSON script
 * element) level by level. Only the drawn level is laid out, and only what is in view
 * is in the DOM, so large graphs open fast. Text from the graph reaches the page only
 * through textContent and setAttribute, never as markup. */
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("mlaxgraph-data").textContent);
  var SVGNS = "http://www.w3.org/2000/svg";
  var COLORS = {
    float32: ["#d0e4f5", "#1c5d99"], bfloat16: ["#ffd8a8", "#d9480f"],
    float16: ["#fff3bf", "#e67700"], float64: ["#e5dbff", "#5f3dc4"],
    float8: ["#ffc9c9", "#c92a2a"], int: ["#d3f9d8", "#2b8a3e"], bool: ["#e9ecef", "#495057"],
    complex: ["#c5f6fa", "#0b7285"], other: ["#f8f9fa", "#495057"]
  };
  var RAMP = [[255, 247, 236], [253, 187, 132], [215, 48, 31], [127, 0, 0]];
  var OVERLAY_NAMES = {dtype: "dtype", flops: "FLOPs", params: "params",
                       activation_bytes: "activation bytes", custom: "values"};
  var NODE_H = 42, GAP_X = 24, GAP_Y = 34, PAD = 12, HEAD = 28, MAX_CHARS = 56;
  var FONT = '12px "DejaVu Sans", "Liberation Sans", Arial, sans-serif';
  var FONT_B = 'bold ' + FONT;

  var $ = function (sel) { return document.querySelector(sel); };
  var svg = $("#mg-svg"), world = $("#mg-world");
  var layerClusters = $("#mg-clusters"), layerEdges = $("#mg-edges"), layerNodes = $("#mg-nodes");
  var panel = $("[data-panel]"), legend = $("#mg-legend");
  var search = $("#mg-search"), count = $("#mg-count");
  var overlaySelect = $("#mg-overlay");

  // --- the tree: every node with its parent, and its path of ancestors --------------
  var byId = new Map(), parentOf = new Map(), order = [];
  (function index(scope, parent) {
    scope.n.forEach(function (n) {
      byId.set(n.id, n); parentOf.set(n.id, parent); order.push(n);
      if (n.sub) index(n.sub, n);
    });
  })(D.root, null);

  var expanded = new Set();
  var view = {k: 1, tx: 0, ty: 0};
  var items = [], edges = [], drawnNodes = new Map(), drawnEdges = new Map();
  var selected = null, matches = [], matchSet = new Set(), current = -1;
  var containsMatch = new Set();
  var overlay = D.overlay || "dtype", range = null;

  // --- text ---------------------------------------------------------------------------
  var ctx = document.createElement("canvas").getContext("2d");
  var widthCache = new Map();
  function textWidth(text, bold) {
    var key = (bold ? "b" : "n") + text;
    var w = widthCache.get(key);
    if (w === undefined) {
      ctx.font = bold ? FONT_B : FONT;
      w = ctx.measureText(text).width * 1.08 + 2; // generous: fonts differ between systems
      widthCache.set(key, w);
    }
    return w;
  }
  function clip(text) {
    text = String(text);
    return text.length > MAX_CHARS ? text.slice(0, MAX_CHARS - 1) + "\u2026" : text;
  }
  function specText(out) { return out ? out[0] + out[1] : ""; }
  function lines(n) {
    if (n.fold) return [n.title, "folded: " + n.fold + " \u00d7 block " + n.graph + " (click)"];
    if (n.runs) return [n.name, "scan \u00b7 block " + n.graph + " \u00d7 " + n.runs + " \u00b7 " +
                        specText(n.outs[0])];
    if (n.sub) return [n.name, "block " + n.graph + " \u00b7 " + n.layers + " layers \u00b7 " +
                       specText(n.outs[0])];
    var op = n.op === "cast" && n.inserted ? "cast (policy)" : n.op;
    var outs = n.outs.length > 1 ? n.outs.length + " outputs" : specText(n.outs[0]);
    return [n.name, op + " \u00b7 " + outs];
  }
  function isOpen(n) { return !!n.sub && expanded.has(n.id); }

  // --- layout: layered, one scope at a time ---------------------------------------------
  function layoutScope(scope) {
    var N = scope.n.length, preds = [], succs = [], indeg = [], i;
    for (i = 0; i < N; i++) { preds.push([]); succs.push([]); indeg.push(0); }
    scope.e.forEach(function (e) { preds[e[2]].push(e[0]); succs[e[0]].push(e[2]); indeg[e[2]]++; });
    var rank = new Array(N).fill(0), queue = [], topo = [];
    for (i = 0; i < N; i++) if (!indeg[i]) queue.push(i);
    for (var q = 0; q < queue.length; q++) {
      var u = queue[q]; topo.push(u);
      succs[u].forEach(function (v) { rank[v] = Math.max(rank[v], rank[u] + 1); if (!--indeg[v]) queue.push(v); });
    }
    if (topo.length < N) {  // a cycle (only a diff of two graphs can make one): draw it anyway
      var seen = new Set(topo);
      for (i = 0; i < N; i++) if (!seen.has(i)) topo.push(i);
    }
    var boxes = scope.n.map(function (n) {
      if (isOpen(n)) {
        var inner = layoutScope(n.sub);
        var titleW = textWidth(clip(n.fold ? n.title : n.name + " \u00b7 block " + n.graph), true) + 40;
        return {w: Math.max(inner.w + 2 * PAD, titleW), h: inner.h + HEAD + PAD, inner: inner};
      }
      var ls = lines(n);
      var w = Math.max(textWidth(clip(ls[0]), true), textWidth(clip(ls[1]), false)) + 24;
      return {w: Math.max(w, 90), h: NODE_H + (n.fold ? 6 : 0)};
    });
    var rows = [];
    topo.forEach(function (u) { (rows[rank[u]] = rows[rank[u]] || []).push(u); });
    var xs = new Array(N).fill(0), ys = new Array(N).fill(0), pos = new Array(N).fill(0);
    var rowTop = [], rowRight = [], y = 0, width = 0;
    rows.forEach(function (row, r) {
      row.forEach(function (u) {
        var p = preds[u];
        pos[u] = p.length ? p.reduce(function (a, b) { return a + xs[b] + boxes[b].w / 2; }, 0) / p.length : 0;
      });
      row.sort(function (a, b) { return pos[a] - pos[b] || a - b; });
      var total = row.reduce(function (a, u) { return a + boxes[u].w; }, 0) + GAP_X * (row.length - 1);
      var center = row.length === 1 ? pos[row[0]] : row.reduce(function (a, u) { return a + pos[u]; }, 0) / row.length;
      var x = (r === 0 ? 0 : center) - total / 2, h = 0;
      row.forEach(function (u) { xs[u] = x; ys[u] = y; x += boxes[u].w + GAP_X; h = Math.max(h, boxes[u].h); });
      rowTop.push(y); y += h + GAP_Y;
    });
    var minX = Infinity, maxX = -Infinity;
    for (i = 0; i < N; i++) { minX = Math.min(minX, xs[i]); maxX = Math.max(maxX, xs[i] + boxes[i].w); }
    if (!N) { minX = 0; maxX = 0; }
    for (i = 0; i < N; i++) xs[i] -= minX;
    rows.forEach(function (row, r) {
      rowRight[r] = row.reduce(function (a, u) { return Math.max(a, xs[u] + boxes[u].w); }, 0);
    });
    width = maxX - minX;
    // An edge skipping rows bends around them, on the right, in lanes.
    var bends = [], lane = 0;
    scope.e.forEach(function (e, k) {
      var a = rank[e[0]], b = rank[e[2]];
      if (b - a > 1) {
        var right = 0;
        for (var r = a + 1; r < b && r - a < 400; r++) right = Math.max(right, rowRight[r]);
        if (b - a >= 400) right = width;
        var bx = right + 14 + 8 * (lane++ % 6);
        bends[k] = bx; width = Math.max(width, bx + 4);
      }
    });
    return {w: width, h: Math.max(y - GAP_Y, 0), xs: xs, ys: ys, boxes: boxes, bends: bends, scope: scope};
  }

  function place(L, ox, oy, depth) {
    var scope = L.scope;
    scope.n.forEach(function (n, i) {
      var b = L.boxes[i], x = ox + L.xs[i], y = oy + L.ys[i];
      var item = {n: n, x: x, y: y, w: b.w, h: b.h, open: !!b.inner, depth: depth};
      items.push(item); b.item = item;
      if (b.inner) place(b.inner, x + (b.w - b.inner.w) / 2, y + HEAD, depth + 1);
    });
    scope.e.forEach(function (e, k) {
      var s = outPoint(L, e[0], e[1]), t = inPoint(L, e[2], e[3]);
      if (!s || !t) return;
      var bend = L.bends[k] === undefined ? null : ox + L.bends[k];
      var src = scope.n[e[0]], out = src.outs[e[1]] || src.outs[0];
      edges.push({s: s, t: t, bend: bend, cat: out ? out[2] : "other", diff: e[4] || null,
                  tip: (out ? specText(out) : ""), x0: Math.min(s.x, t.x, bend || s.x),
                  x1: Math.max(s.x, t.x, bend || s.x), y0: Math.min(s.y, t.y), y1: Math.max(s.y, t.y)});
    });
  }
  function outPoint(L, i, o) {
    var b = L.boxes[i], n = L.scope.n[i];
    if (b.inner) { var p = n.sub.o[o] || n.sub.o[0]; return p ? outPoint(b.inner, p[0], p[1]) : null; }
    var k = n.outs.length || 1;
    return {x: b.item.x + b.w * (o + 1) / (k + 1), y: b.item.y + b.h};
  }
  function inPoint(L, i, slot) {
    var b = L.boxes[i], n = L.scope.n[i];
    if (b.inner) { var p = n.sub.i[slot] || n.sub.i[0]; return p ? inPoint(b.inner, p[0], p[1]) : null; }
    var k = n.nin || 1;
    return {x: b.item.x + b.w * (slot + 1) / (k + 1), y: b.item.y};
  }

  var layout = null;
  function relayout() {
    items = []; edges = [];
    layout = layoutScope(D.root);
    place(layout, 0, 0, 0);
    drawnNodes.forEach(function (el) { el.remove(); }); drawnNodes.clear();
    drawnEdges.forEach(function (el) { el.remove(); }); drawnEdges.clear();
    computeRange();
    drawLegend();
    render();
  }

  // --- colours ----------------------------------------------------------------------
  function value(n) {
    if (overlay === "flops") return n.flops_v;
    if (overlay === "params") return n.params;
    if (overlay === "activation_bytes") return n.act_v;
    if (overlay === "custom") return n.val;
    return null;
  }
  function computeRange() {
    range = null;
    if (overlay === "dtype") return;
    var lo = Infinity, hi = -Infinity;
    items.forEach(function (it) {
      if (it.open) return;
      var v = value(it.n);
      if (v > 0) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    });
    if (hi > 0) range = {lo: lo, hi: hi};
  }
  function ramp(t) {
    t = Math.max(0, Math.min(1, t)) * (RAMP.length - 1);
    var i = Math.min(Math.floor(t), RAMP.length - 2), f = t - i, a = RAMP[i], b = RAMP[i + 1];
    return "rgb(" + [0, 1, 2].map(function (c) { return Math.round(a[c] + (b[c] - a[c]) * f); }).join(",") + ")";
  }
  function position(v) {
    if (!range || !(v > 0)) return null;
    return range.hi === range.lo ? 1 : (Math.log(v) - Math.log(range.lo)) / (Math.log(range.hi) - Math.log(range.lo));
  }
  function colours(n) {
    if (overlay === "dtype") return COLORS[n.cat] || COLORS.other;
    var t = position(value(n));
    if (t === null) return ["#f8f9fa", "#adb5bd", "#868e96"];
    return [ramp(t), "#495057", t > 0.55 ? "#ffffff" : "#212529"];
  }

  // --- drawing ------------------------------------------------------------------------
  function el(tag, attrs, parent) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function text(parent, x, y, content, cls) {
    var t = el("text", {x: x, y: y, "class": cls}, parent);
    t.textContent = clip(content);
    return t;
  }
  function mark(g, n) {
    g.setAttribute("data-node", n.id);
    g.setAttribute("data-op", n.op);
    if (n.fold) g.setAttribute("data-fold", String(n.fold));
    if (n.diff) g.setAttribute("data-diff", n.diff);
    if (n.diffInside) g.setAttribute("data-diff-inside", "true");
    if (matchSet.has(n.id)) g.setAttribute("data-match", "true");
    if (containsMatch.has(n.id)) g.setAttribute("data-contains-match", "true");
    if (selected === n.id) g.setAttribute("data-selected", "true");
    if (current >= 0 && matches[current] === n.id) g.setAttribute("data-current", "true");
  }
  function drawItem(it) {
    var n = it.n, g, c = colours(n), tip;
    if (it.open) {
      g = el("g", {"class": "mg-cluster", transform: "translate(" + it.x + "," + it.y + ")"}, layerClusters);
      g.setAttribute("data-expanded", "true");
      el("rect", {width: it.w, height: it.h, rx: 8, "class": "mg-cluster-box"}, g);
      var head = el("g", {"class": "mg-cluster-head"}, g);
      el("rect", {width: it.w, height: HEAD - 6, rx: 8, "class": "mg-cluster-headbox"}, head);
      text(head, 10, 16, "\u2212 " + (n.fold ? n.title : n.name + " \u00b7 block " + n.graph), "mg-title");
    } else {
      g = el("g", {"class": "mg-node" + (n.sub ? " mg-block" : "") + (n.op === "input" ? " mg-input" : ""),
                   transform: "translate(" + it.x + "," + it.y + ")"}, layerNodes);
      if (n.fold) el("rect", {x: 6, y: 6, width: it.w - 6, height: it.h - 6, rx: 6, fill: c[0], stroke: c[1], "class": "mg-stack"}, g);
      var shape = n.op === "cast" ? "mg-shape mg-cast" + (n.inserted ? " mg-inserted" : "") : "mg-shape";
      el("rect", {width: it.w - (n.fold ? 6 : 0), height: it.h - (n.fold ? 6 : 0), rx: n.op === "input" ? 14 : 6,
                  fill: c[0], stroke: c[1], "class": shape}, g);
      var ls = lines(n);
      text(g, 10, 17, ls[0], "mg-name").setAttribute("fill", c[2] || "#212529");
      text(g, 10, 33, ls[1], "mg-sub").setAttribute("fill", c[2] || "#343a40");
      if (n.sub) text(g, it.w - (n.fold ? 22 : 16), 17, "+", "mg-plus");
    }
    tip = el("title", {}, g); tip.textContent = n.id + " (" + n.op + ")";
    mark(g, n);
    return g;
  }
  function edgePath(e) {
    var s = e.s, t = e.t;
    if (e.bend === null) {
      var dy = Math.max((t.y - s.y) / 2, 10);
      return "M" + s.x + "," + s.y + "C" + s.x + "," + (s.y + dy) + " " + t.x + "," + (t.y - dy) + " " + t.x + "," + t.y;
    }
    var b = e.bend;
    return "M" + s.x + "," + s.y + "C" + s.x + "," + (s.y + 18) + " " + b + "," + (s.y + 6) + " " + b + "," + (s.y + 30) +
           "L" + b + "," + (t.y - 30) + "C" + b + "," + (t.y - 6) + " " + t.x + "," + (t.y - 18) + " " + t.x + "," + t.y;
  }
  function drawEdge(e) {
    var colour = overlay === "dtype" ? (COLORS[e.cat] || COLORS.other)[1] : "#868e96";
    var p = el("path", {d: edgePath(e), stroke: colour, "class": "mg-edge", "marker-end": "url(#mg-arrow)"}, layerEdges);
    if (e.diff) p.setAttribute("data-diff", e.diff);
    var tip = el("title", {}, p); tip.textContent = e.tip;
    return p;
  }
  function visibleRect() {
    var r = svg.getBoundingClientRect(), m = 200 / view.k;
    return {x0: -view.tx / view.k - m, y0: -view.ty / view.k - m,
            x1: (r.width - view.tx) / view.k + m, y1: (r.height - view.ty) / view.k + m};
  }
  function render() {
    world.setAttribute("transform", "translate(" + view.tx + "," + view.ty + ") scale(" + view.k + ")");
    var v = visibleRect();
    items.forEach(function (it, k) {
      var inView = it.x < v.x1 && it.x + it.w > v.x0 && it.y < v.y1 && it.y + it.h > v.y0;
      var g = drawnNodes.get(k);
      if (inView && !g) drawnNodes.set(k, drawItem(it));
      else if (!inView && g) { g.remove(); drawnNodes.delete(k); }
    });
    edges.forEach(function (e, k) {
      var inView = e.x0 < v.x1 && e.x1 > v.x0 && e.y0 < v.y1 && e.y1 > v.y0;
      var p = drawnEdges.get(k);
      if (inView && !p) drawnEdges.set(k, drawEdge(e));
      else if (!inView && p) { p.remove(); drawnEdges.delete(k); }
    });
  }
  function redraw() {  // colours or marks changed: rebuild what is drawn
    drawnNodes.forEach(function (el) { el.remove(); }); drawnNodes.clear();
    drawnEdges.forEach(function (el) { el.remove(); }); drawnEdges.clear();
    render();
  }
  var pending = false;
  function schedule() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () { pending = false; render(); });
  }

  // --- view: fit, pan, zoom ------------------------------------------------------------
  function fit() {
    var r = svg.getBoundingClientRect(), w = layout.w + 40, h = layout.h + 40;
    var k = Math.min(r.width / w, r.height / h, 1.25);
    if (k < 0.45) {  // too big to read whole: start at the top, at a readable scale
      k = Math.max(Math.min(1, r.width / w), 0.45);
      view = {k: k, tx: Math.max((r.width - layout.w * k) / 2, 20), ty: 20};
    } else {
      view = {k: k, tx: (r.width - layout.w * k) / 2, ty: (r.height - layout.h * k) / 2};
    }
    render();
  }
  function zoomAt(factor, cx, cy) {
    var k = Math.max(0.03, Math.min(4, view.k * factor));
    view.tx = cx - (cx - view.tx) * (k / view.k); view.ty = cy - (cy - view.ty) * (k / view.k); view.k = k;
    schedule();
  }
  function centerOn(it) {
    var r = svg.getBoundingClientRect();
    if (view.k < 0.6) view.k = 0.9;
    view.tx = r.width / 2 - (it.x + it.w / 2) * view.k;
    view.ty = r.height / 3 - (it.y + Math.min(it.h, 80) / 2) * view.k;
    render();
  }
  var drag = null, moved = false;
  svg.addEventListener("mousedown", function (ev) {
    drag = {x: ev.clientX, y: ev.clientY, tx: view.tx, ty: view.ty}; moved = false;
  });
  window.addEventListener("mousemove", function (ev) {
    if (!drag) return;
    var dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 4) moved = true;
    if (moved) { view.tx = drag.tx + dx; view.ty = drag.ty + dy; schedule(); }
  });
  window.addEventListener("mouseup", function () { drag = null; });
  svg.addEventListener("wheel", function (ev) {
    ev.preventDefault();
    var r = svg.getBoundingClientRect();
    zoomAt(Math.exp(-ev.deltaY * 0.0015), ev.clientX - r.left, ev.clientY - r.top);
  }, {passive: false});
  svg.addEventListener("click", function (ev) {
    if (moved) return;
    var g = ev.target.closest("[data-node]");
    if (!g) return;
    var n = byId.get(g.getAttribute("data-node"));
    if (!n) return;
    if (n.sub) toggle(n.id);
    select(n.id);
  });
  $("#mg-zoom-in").addEventListener("click", function () { var r = svg.getBoundingClientRect(); zoomAt(1.25, r.width / 2, r.height / 2); });
  $("#mg-zoom-out").addEventListener("click", function () { var r = svg.getBoundingClientRect(); zoomAt(0.8, r.width / 2, r.height / 2); });
  $("#mg-fit").addEventListener("click", fit);
  window.addEventListener("resize", schedule);

  // --- expanding ------------------------------------------------------------------------
  function toggle(id) {
    if (expanded.has(id)) expanded.delete(id); else expanded.add(id);
    relayout();
  }
  var expandAll = $("#mg-expand-all");
  expandAll.addEventListener("click", function () {
    var all = expandAll.getAttribute("data-state") !== "expanded";
    expanded.clear();
    if (all) order.forEach(function (n) { if (n.sub) expanded.add(n.id); });
    expandAll.setAttribute("data-state", all ? "expanded" : "collapsed");
    expandAll.textContent = all ? "collapse all" : "expand all";
    relayout(); fit();
  });
  function reveal(id) {
    for (var p = parentOf.get(id); p; p = parentOf.get(p.id)) expanded.add(p.id);
    relayout();
    for (var k = 0; k < items.length; k++) if (items[k].n.id === id) { centerOn(items[k]); break; }
  }

  // --- search -----------------------------------------------------------------------------
  function runSearch() {
    var q = search.value.trim().toLowerCase();
    matches = []; matchSet = new Set(); containsMatch = new Set(); current = -1;
    if (q) order.forEach(function (n) {
      if (n.fold) return;
      if (n.id.toLowerCase().indexOf(q) >= 0 || n.op.toLowerCase() === q) {
        matches.push(n.id); matchSet.add(n.id);
        for (var p = parentOf.get(n.id); p; p = parentOf.get(p.id)) containsMatch.add(p.id);
      }
    });
    count.textContent = q ? (matches.length ? "0 / " + matches.length : "no match") : "";
    redraw();
  }
  function step(delta) {
    if (!matches.length) return;
    current = (current + delta + matches.length) % matches.length;
    count.textContent = (current + 1) + " / " + matches.length;
    reveal(matches[current]);
    select(matches[current]);
  }
  search.addEventListener("input", runSearch);
  search.addEventListener("keydown", function (ev) {
    if (ev.key === "Enter") { ev.preventDefault(); step(ev.shiftKey ? -1 : 1); }
  });
  $("#mg-next").addEventListener("click", function () { step(1); });
  $("#mg-prev").addEventListener("click", function () { step(-1); });

  // --- the details panel ---------------------------------------------------------------
  function h(tag, content, cls) {
    var e = document.createElement(tag);
    if (content !== undefined && content !== null) e.textContent = String(content);
    if (cls) e.className = cls;
    return e;
  }
  function fmt(v) { return v === null || v === undefined ? "?" : Number(v).toLocaleString("en-US", {maximumFractionDigits: 3}); }
  function bytes(v) {
    if (v === null || v === undefined) return "?";
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(1) : fmt(v)) + " " + units[i];
  }
  function at() {
    var parts = Object.keys(D.dims).map(function (k) { return k + "=" + D.dims[k]; });
    D.unbound.forEach(function (k) { parts.push(k + "=1"); });
    return parts.length ? " at " + parts.join(", ") : "";
  }
  function section(title, rows, table) {
    if (!rows || !rows.length) return;
    panelBody.appendChild(h("h3", title));
    if (table) {
      var t = h("table");
      rows.forEach(function (r) {
        var tr = h("tr");
        r.forEach(function (c) { tr.appendChild(h("td", c)); });
        t.appendChild(tr);
      });
      panelBody.appendChild(t);
    } else rows.forEach(function (r) { panelBody.appendChild(h("div", r, "mg-row")); });
  }
  var panelBody = $("#mg-panel-body");
  function select(id) {
    var n = byId.get(id);
    if (!n) return;
    selected = id;
    panelBody.textContent = "";
    panelBody.appendChild(h("h2", n.fold ? n.title : n.name));
    panelBody.appendChild(h("div", n.id, "mg-path"));
    var op = n.fold ? "block \u00d7 " + n.fold + " (" + n.graph + ")" : n.runs ?
      "scan: block \u00d7 " + n.runs + " (" + n.graph + ", " + n.layers + " layers; one block drawn, the cost is the run's)" : n.sub ? "block (" + n.graph + ", " + n.layers + " layers)" : n.op;
    section("op", [op + (n.inserted ? " \u2014 inserted by the dtype policy" : "")]);
    if (n.diff) section("diff", [n.diff].concat(n.before ? n.before : []));
    section("attributes", (n.attrs || []).map(function (a) { return [a[0], a[1]]; }), true);
    section("outputs", n.outs.map(function (o, j) { return [n.outs.length > 1 ? String(j) : "", o[0] + o[1]]; }), true);
    section("weights", (n.weights || []).map(function (w) {
      return [w[0], w[2] + w[1], w[3], w[4] ? "axes " + w[4] : ""];
    }), true);
    var cost = [["params", n.params_f ? n.params_f + " = " + fmt(n.params) + at() : fmt(n.params)]];
    if (n.shares) cost.push(["weights", "shared with " + n.shares]);
    if ("flops" in n) cost.push(["FLOPs", (n.flops === null ? "no rule" : n.flops + " = " + fmt(n.flops_v) + at())]);
    if ("act" in n) cost.push(["activations", n.act + " bytes = " + bytes(n.act_v) + at()]);
    if (n.val !== undefined) cost.push(["value", fmt(n.val)]);
    section("cost", cost, true);
    var sharding = [];
    if (n.sharding) sharding.push(n.sharding);
    if (n.axes) sharding.push("input axes (" + n.axes.join(",") + ")");
    section("sharding", sharding);
    section("casts", n.casts);
    if (n.src) section("created at", [n.src]);
    if (D.hlo && !n.sub) {
      var ops = n.hlo || [];
      section("optimized HLO (" + ops.length + ")", ops.length ? ops : ["no operations (an identity, or removed by XLA)"]);
    }
    panel.hidden = false;
    panel.setAttribute("data-panel", n.id);
    redraw();
  }
  $("#mg-close").addEventListener("click", function () {
    panel.hidden = true; panel.setAttribute("data-panel", ""); selected = null; redraw();
  });

  // --- overlays and the legend -----------------------------------------------------------
  function option(value, label) {
    var o = h("option", label); o.value = value; overlaySelect.appendChild(o);
  }
  option("dtype", "colour: dtype"); option("flops", "colour: FLOPs"); option("params", "colour: params");
  option("activation_bytes", "colour: activation bytes");
  if (D.custom) option("custom", "colour: values");
  overlaySelect.value = overlay;
  overlaySelect.addEventListener("change", function () { overlay = overlaySelect.value; computeRange(); drawLegend(); redraw(); });
  function swatch(fill, line, label, attr) {
    var row = h("div", null, "mg-legend-row"), s = h("span", null, "mg-swatch");
    s.style.background = fill; s.style.borderColor = line;
    if (attr) s.setAttribute("data-diff", attr);
    row.appendChild(s); row.appendChild(h("span", label)); legend.appendChild(row);
  }
  function drawLegend() {
    legend.textContent = "";
    legend.appendChild(h("div", "colour: " + OVERLAY_NAMES[overlay], "mg-legend-title"));
    if (overlay === "dtype") {
      var cats = new Set();
      order.forEach(function (n) { cats.add(n.cat); });
      Object.keys(COLORS).forEach(function (c) { if (cats.has(c)) swatch(COLORS[c][0], COLORS[c][1], c); });
    } else if (range) {
      var bar = h("div", null, "mg-ramp");
      bar.style.background = "linear-gradient(to right," + [0, 0.33, 0.66, 1].map(ramp).join(",") + ")";
      legend.appendChild(bar);
      var show = overlay === "activation_bytes" ? bytes : fmt;
      legend.appendChild(h("div", show(range.lo) + " \u2026 " + show(range.hi) + " (log scale)" +
                           (overlay === "flops" || overlay === "activation_bytes" ? at() : ""), "mg-legend-note"));
      swatch("#f8f9fa", "#adb5bd", "no value / zero");
    } else legend.appendChild(h("div", "no values in view", "mg-legend-note"));
    if (D.diff) {  // outlines, in colours of their own (the dtypes' are fills)
      legend.appendChild(h("div", "diff: outline", "mg-legend-title"));
      swatch("#ffffff", "#1098ad", "added in " + D.diff[1], "added");
      swatch("#ffffff", "#c92a2a", "removed from " + D.diff[0], "removed");
      swatch("#ffffff", "#e67700", "changed", "changed");
    }
  }

  // --- start ------------------------------------------------------------------------------
  document.title = D.title + " \u2014 mlaxgraph explorer";
  $("#mg-heading").textContent = D.title;
  $("#mg-meta").textContent = fmt(D.params) + " params" + (D.params_f ? at() + " (" + D.params_f + ")" : "") + (D.policy ? " \u00b7 " + D.policy : "") +
    (D.diff ? " \u00b7 diff " + D.diff[0] + " \u2192 " + D.diff[1] : "");
  relayout();
  fit();
  document.body.setAttribute("data-ready", "true");
  // When the first frame is on screen (after the next paint), for measuring.
  requestAnimationFrame(function () {
    setTimeout(function () { document.body.setAttribute("data-painted-ms", String(Math.round(performance.now()))); }, 0);
  });
})();
