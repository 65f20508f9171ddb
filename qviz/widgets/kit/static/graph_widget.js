// qviz GraphWidget front end: places a Graphviz SVG drawn in Python, pans and zooms it, and
// reports clicks and searches back through the widget's traits. Plain ES module for anywidget:
// no dependencies, no build step, nothing fetched from the network.
//
// The drawing sits in one <g class="qviz-viewport"> whose transform is
// translate(tx ty) scale(k) in CSS pixels: vector zoom, always crisp.
// Graphviz writes <g class="node|edge|cluster"><title>NAME</title>...</g>; a node's title is
// its name ("conv2d", "module/layer1", "obs/conv2d"), an edge's "a->b", a cluster's
// "cluster_PATH".

const SVG_NS = "http://www.w3.org/2000/svg";
const DRAG_PX = 4;
const ZOOM_STEP = 1.25;
const MIN_SCALE = 0.02;
const MAX_SCALE = 40;
const PAD = 4;
const CLICKABLE = "g.node, g.edge, g.cluster";

function make(tag, className, parent, ns) {
  const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  if (className) node.setAttribute("class", className);
  if (parent) parent.appendChild(node);
  return node;
}

function button(parent, text, title) {
  const b = make("button", "qviz-graph-button", parent);
  b.type = "button";
  b.textContent = text;
  b.title = title;
  return b;
}

function buildChrome(el) {
  const root = make("div", "qviz-graph", el);
  const bar = make("div", "qviz-graph-toolbar", root);
  const input = make("input", "qviz-graph-search", bar);
  input.type = "search";
  input.placeholder = "search nodes";
  input.spellcheck = false;
  const count = make("span", "qviz-graph-count", bar);
  const zoomIn = button(bar, "+", "zoom in");
  const zoomOut = button(bar, "\u2212", "zoom out");
  const reset = button(bar, "reset", "the whole graph if it fits at a legible scale, else its top at that scale");
  const legend = button(bar, "legend", "show or hide the drawing's legend");
  const viewport = make("div", "qviz-graph-viewport", root);
  return { root, input, count, zoomIn, zoomOut, reset, legend, viewport };
}

function titleOf(group) {
  const t = group.querySelector(":scope > title");
  return t ? t.textContent.trim() : "";
}

function kindOf(group) {
  const cls = group.classList;
  return cls.contains("node") ? "node" : cls.contains("edge") ? "edge" : "cluster";
}

// ---- placing the SVG -------------------------------------------------------------------------

function viewBoxOf(svg) {
  const box = (svg.getAttribute("viewBox") || "").trim().split(/[\s,]+/).map(Number);
  if (box.length === 4 && box.every(Number.isFinite)) return box;
  return [0, 0, parseFloat(svg.getAttribute("width")) || 100, parseFloat(svg.getAttribute("height")) || 100];
}

function parseSvg(text) {
  const doc = new DOMParser().parseFromString(text, "image/svg+xml");
  const svg = doc.documentElement;
  if (svg.nodeName.toLowerCase() !== "svg" || doc.querySelector("parsererror")) return null;
  return document.importNode(svg, true);
}

// A wide invisible stroke over thin outlines (edges, cluster borders) so they are easy to click.
function widenHitAreas(root) {
  for (const shape of root.querySelectorAll("g.edge path, g.cluster > path, g.cluster > polygon")) {
    const hit = shape.cloneNode(false);
    hit.setAttribute("class", "qviz-hit");
    hit.removeAttribute("stroke-dasharray");
    shape.after(hit);
  }
}

// The drawing's text sizes in SVG user units (Graphviz: points; one CSS pixel at scale 1):
// the smallest and the median. Text without a size of its own counts as Graphviz's 14.
function fontSizes(svg) {
  const sizes = [...svg.querySelectorAll("text")]
    .map((t) => parseFloat(t.getAttribute("font-size") || t.closest("[font-size]")?.getAttribute("font-size")))
    .filter((v) => Number.isFinite(v) && v > 0)
    .sort((a, b) => a - b);
  if (!sizes.length) return { smallest: 14, typical: 14 };
  return { smallest: sizes[0], typical: sizes[Math.floor(sizes.length / 2)] };
}

function placeSvg(view, text) {
  view.viewport.replaceChildren();
  view.svg = view.g = view.overlay = view.legendBox = view.legend = null;
  if (view.legendButton) view.legendButton.hidden = true;
  const svg = text ? parseSvg(text) : null;
  if (!svg) {
    make("div", "qviz-graph-empty", view.viewport).textContent = text ? "not an SVG drawing" : "no graph";
    return;
  }
  const [x0, y0, w, h] = viewBoxOf(svg);
  view.box = { x0, y0, w, h };
  view.fonts = fontSizes(svg);
  view.top = undefined; // spineX() measures the new drawing once it is laid out
  for (const attr of ["width", "height", "viewBox"]) svg.removeAttribute(attr);
  svg.setAttribute("width", "100%");
  svg.setAttribute("height", "100%");
  svg.classList.add("qviz-graph-svg");
  const g = make("g", "qviz-viewport", null, SVG_NS);
  g.append(...svg.childNodes);
  svg.appendChild(g);
  widenHitAreas(g);
  view.overlay = make("g", "qviz-overlay", g, SVG_NS);
  view.viewport.appendChild(svg);
  Object.assign(view, { svg, g, fitted: false, content: undefined });
  takeLegend(view);
}

// The legend is not part of the drawing the pane fits (a long legend beside a narrow graph
// would make it open cropped): it leaves the drawing, and the toolbar's "legend" button shows
// it in a box over the pane's top right, at the scale at which its text is legible (the box
// exists only while shown).
function takeLegend(view) {
  const group = [...view.g.querySelectorAll("g.node")].find((n) => titleOf(n) === "legend");
  view.legend = group ? { group, transform: group.parentElement.getAttribute("transform") } : null;
  if (group) group.remove();
  if (view.legendButton) view.legendButton.hidden = !group;
  if (group && view.legendOpen) showLegend(view, true); // kept open across redraws
}

function showLegend(view, show) {
  if (view.legendBox) view.legendBox.remove();
  view.legendBox = null;
  view.legendOpen = show && Boolean(view.legend);
  if (!view.legendOpen) return;
  const box = make("div", "qviz-graph-legend", view.viewport);
  box.addEventListener("pointerdown", (event) => event.stopPropagation());
  box.addEventListener("wheel", (event) => event.stopPropagation());
  const svg = make("svg", "", box, SVG_NS);
  const outer = make("g", "", svg, SVG_NS);
  const inner = make("g", "", outer, SVG_NS);
  if (view.legend.transform) inner.setAttribute("transform", view.legend.transform); // graph0's
  inner.appendChild(view.legend.group);
  const b = outer.getBBox(); // in outer's coordinates, before its own scale
  const k = legibleScale(view);
  outer.setAttribute("transform", `scale(${k}) translate(${2 - b.x} ${2 - b.y})`);
  svg.setAttribute("width", `${k * (b.width + 4)}`);
  svg.setAttribute("height", `${k * (b.height + 4)}`);
  view.legendBox = box;
}

// The drawing's content (nodes, edges, clusters; not the legend nor Graphviz's background) in
// the viewport group's coordinates: what the pane fits. Measured once per drawing, laid out.
function contentBox(view) {
  if (view.content === undefined) {
    const parts = view.g.querySelectorAll(":scope g.node, :scope g.edge, :scope g.cluster");
    let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
    for (const part of parts) {
      const b = boxOf(view, part);
      if (!(b.width > 0 || b.height > 0)) continue;
      x0 = Math.min(x0, b.x);
      y0 = Math.min(y0, b.y);
      x1 = Math.max(x1, b.x + b.width);
      y1 = Math.max(y1, b.y + b.height);
    }
    const pad = 4;
    view.content = Number.isFinite(x0)
      ? { x0: x0 - pad, y0: y0 - pad, w: x1 - x0 + 2 * pad, h: y1 - y0 + 2 * pad }
      : view.box;
  }
  return view.content;
}

// ---- pan and zoom --------------------------------------------------------------------------

function apply(view) {
  if (view.g) view.g.setAttribute("transform", `translate(${view.tx} ${view.ty}) scale(${view.k})`);
}

function size(view) {
  return { cw: view.viewport.clientWidth, ch: view.viewport.clientHeight };
}

// Legible by default: no view the widget picks by itself (the first one, after a resize, after
// "reset") has a scale under legibleScale(), at which the drawing's smallest text is
// MIN_TEXT_PX CSS pixels high and its typical (median) label TYPICAL_TEXT_PX; a big graph is
// then larger than the pane, and the user pans (drag) or zooms (wheel, + / -) for the rest.
// Only the user's own zooming goes below it.
//   first view: fit the pane's width, at most MAX_OPEN_SCALE, never under legibleScale(); a
//     graph wider than the pane opens centred on its topmost node (openLeft), one taller than
//     the pane at its top.
//   "reset": the whole graph (fit width and height, at most MAX_OPEN_SCALE) when that scale is
//     legible; otherwise legibleScale(), placed as the first view is.
const MIN_TEXT_PX = 10;
const TYPICAL_TEXT_PX = 11;
const MAX_OPEN_SCALE = 1.5;

function legibleScale(view) {
  const { smallest, typical } = view.fonts || { smallest: 14, typical: 14 };
  return Math.max(MIN_TEXT_PX / smallest, TYPICAL_TEXT_PX / typical);
}

function openScale(view, cw) {
  return Math.max(legibleScale(view), Math.min(cw / contentBox(view).w, MAX_OPEN_SCALE));
}

function resetScale(view, cw, ch) {
  const { w, h } = contentBox(view);
  return Math.max(legibleScale(view), Math.min(cw / w, ch / h, MAX_OPEN_SCALE));
}

// Not cropped at the sides: when the graph at the legible scale is wider than the pane's share
// of the row, the first view widens the pane (view.el, a flex item beside the panel) as far as
// the panel keeps model "panel_width" pixels, and gives it its share back when that suffices
// (the row grew). Returns whether the pane's width changed (the resize that follows opens the
// graph again). Never after the user dragged the splitter.
function widenPane(view) {
  const el = view.el;
  const parent = el && el.parentElement;
  const panelWidth = view.panelWidth ? view.panelWidth() : 0;
  if (!parent || view.resized || !panelWidth) return false;
  const width = el.getBoundingClientRect().width;
  const needed = legibleScale(view) * contentBox(view).w + 16 + (width - size(view).cw);
  const row = parent.getBoundingClientRect().width;
  const target = Math.floor(Math.min(needed, row - panelWidth));
  if (el.qvizShare === undefined) {
    // not before the widget's layout gave the pane its share (it arrives a moment after the
    // first view, and the resize it makes opens the graph again)
    if (!el.style.flex || target <= width + 1) return false;
    el.qvizShare = el.style.flex; // the share the widget's layout gave it, given back below
    el.style.flex = `0 0 ${target}px`;
    return true;
  }
  const percent = /([\d.]+)%/.exec(el.qvizShare);
  const share = percent ? (row * parseFloat(percent[1])) / 100 : 0;
  const flex = target > share + 1 ? `0 0 ${target}px` : el.qvizShare;
  if (flex === el.qvizShare) el.qvizShare = undefined;
  if (el.style.flex === flex) return false;
  el.style.flex = flex;
  return true;
}

// The x (drawing coordinates) of the drawing's spine: the median of its nodes' centres (the
// legend does not count), where a model's main chain runs; the topmost node may sit off to one
// side (an input drawn above a branch). Found once per drawing, since every resize re-opens it.
function spineX(view) {
  if (view.top === undefined) {
    const xs = groups(view, "node").filter((g) => titleOf(g) !== "legend").map((g) => {
      const b = boxOf(view, g);
      return b.x + b.width / 2;
    });
    xs.sort((a, b) => a - b);
    view.top = xs.length ? xs[Math.floor(xs.length / 2)] : null;
  }
  return view.top;
}

// A graph wider than the pane opens with its spine in the middle of the pane, without empty
// space beside the drawing.
function openLeft(view, cw) {
  const { x0, w } = contentBox(view);
  const k = view.k;
  const spine = spineX(view);
  if (spine === null) return 8 - k * x0;
  const want = cw / 2 - k * spine;
  return Math.min(8 - k * x0, Math.max(cw - 8 - k * (x0 + w), want));
}

function fit(view, reset = false) {
  const { cw, ch } = size(view);
  if (!view.g || cw === 0 || ch === 0) return false;
  if (view.rowObserver && !view.row && view.el && view.el.parentElement) {
    view.row = view.el.parentElement; // the row it shares with the panel: widen as it changes
    view.rowObserver.observe(view.row);
  }
  if (!reset) widenPane(view); // a wider pane: the resize that follows opens it again
  const { x0, y0, w, h } = contentBox(view);
  view.k = reset ? resetScale(view, cw, ch) : openScale(view, cw);
  view.tx = view.k * w <= cw ? (cw - view.k * w) / 2 - view.k * x0 : openLeft(view, cw);
  view.ty = view.k * h <= ch ? (ch - view.k * h) / 2 - view.k * y0 : 8 - view.k * y0;
  view.fitted = true;
  apply(view);
  return true;
}

// A bar on the pane's right edge: drag it to widen or narrow the graph beside its panel.
function addSplitter(el, root) {
  const grip = make("div", "qviz-graph-splitter", root);
  grip.title = "drag to widen or narrow the graph";
  let start = null;
  grip.addEventListener("pointerdown", (event) => {
    start = { x: event.clientX, width: el.getBoundingClientRect().width };
    grip.setPointerCapture(event.pointerId);
    event.preventDefault();
    event.stopPropagation();
  });
  grip.addEventListener("pointermove", (event) => {
    if (!start) return;
    const parent = el.parentElement ? el.parentElement.getBoundingClientRect().width : Infinity;
    const width = Math.min(Math.max(200, start.width + event.clientX - start.x), parent - 160);
    el.style.width = `${width}px`;
    el.style.flex = `0 0 ${width}px`;
    el.qvizResized = true; // the first view no longer widens the pane by itself
  });
  const stop = (event) => {
    if (start) grip.releasePointerCapture(event.pointerId);
    start = null;
  };
  grip.addEventListener("pointerup", stop);
  grip.addEventListener("pointercancel", stop);
}

function zoomAt(view, mx, my, factor) {
  const k = Math.min(MAX_SCALE, Math.max(MIN_SCALE, view.k * factor));
  const f = k / view.k;
  view.tx = mx - (mx - view.tx) * f;
  view.ty = my - (my - view.ty) * f;
  view.k = k;
  view.touched = true;
  apply(view);
}

function zoomCentre(view, factor) {
  const { cw, ch } = size(view);
  zoomAt(view, cw / 2, ch / 2, factor);
}

function onWheel(view, event) {
  if (!view.g) return;
  event.preventDefault();
  const rect = view.svg.getBoundingClientRect();
  const delta = event.deltaMode === 1 ? event.deltaY * 16 : event.deltaY;
  zoomAt(view, event.clientX - rect.left, event.clientY - rect.top, Math.exp(-delta * 0.0015));
}

function panHandlers(view) {
  let start = null;
  const down = (event) => {
    view.dragged = false;
    if (event.button !== 0 || !view.g) return;
    start = { x: event.clientX, y: event.clientY, tx: view.tx, ty: view.ty, id: event.pointerId };
  };
  const move = (event) => {
    if (!start) return;
    const dx = event.clientX - start.x;
    const dy = event.clientY - start.y;
    if (!view.dragged && Math.hypot(dx, dy) < DRAG_PX) return;
    if (!view.dragged) view.svg.setPointerCapture(start.id); // late: a plain click keeps its target
    view.dragged = true;
    view.touched = true;
    view.tx = start.tx + dx;
    view.ty = start.ty + dy;
    apply(view);
  };
  const up = () => {
    start = null;
  };
  return { down, move, up };
}

// ---- finding, outlining and centring elements ---------------------------------------------------

// The element's bounding box in the viewport group's coordinates (before its transform).
function boxOf(view, element) {
  const b = element.getBBox();
  const m = view.g.getCTM().inverse().multiply(element.getCTM());
  const corners = [
    [b.x, b.y],
    [b.x + b.width, b.y],
    [b.x, b.y + b.height],
    [b.x + b.width, b.y + b.height],
  ].map(([x, y]) => new DOMPoint(x, y).matrixTransform(m));
  const xs = corners.map((p) => p.x);
  const ys = corners.map((p) => p.y);
  const x = Math.min(...xs);
  const y = Math.min(...ys);
  return { x, y, width: Math.max(...xs) - x, height: Math.max(...ys) - y };
}

function isVisible(view, box) {
  const { cw, ch } = size(view);
  const left = view.tx + view.k * box.x;
  const top = view.ty + view.k * box.y;
  return left >= 0 && top >= 0 && left + view.k * box.width <= cw && top + view.k * box.height <= ch;
}

function centre(view, box) {
  const { cw, ch } = size(view);
  view.tx = cw / 2 - view.k * (box.x + box.width / 2);
  view.ty = ch / 2 - view.k * (box.y + box.height / 2);
  apply(view);
}

function outline(view, box, className) {
  const rect = make("rect", `qviz-outline ${className}`, view.overlay, SVG_NS);
  rect.setAttribute("x", box.x - PAD);
  rect.setAttribute("y", box.y - PAD);
  rect.setAttribute("width", box.width + 2 * PAD);
  rect.setAttribute("height", box.height + 2 * PAD);
  rect.setAttribute("rx", PAD);
  return rect;
}

function clearMarks(view, className) {
  if (!view.g) return;
  for (const old of view.overlay.querySelectorAll(`.${className}-outline`)) old.remove();
  for (const old of view.g.querySelectorAll(`.${className}`)) old.classList.remove(className);
}

function groups(view, kind) {
  return view.g ? [...view.g.querySelectorAll(`g.${kind}`)] : [];
}

// The element `selected` names: the one just clicked, else a node, an edge ("a -> b"), the
// observer marker standing for that plan tensor, a collapsed module box or a module cluster.
function findSelected(view, model, name) {
  if (!name || !view.g) return null;
  if (view.clicked && view.clicked.name === name && view.g.contains(view.clicked.element)) {
    return view.clicked.element;
  }
  const byTitle = (kind, title) => groups(view, kind).find((g) => titleOf(g) === title);
  const refs = model.get("_marker_refs") || {};
  const marker = Object.keys(refs).find((m) => refs[m].includes(name));
  const edgeRefs = model.get("_edge_refs") || {};
  const edge = Object.keys(edgeRefs).find((e) => edgeRefs[e] === name);
  const path = name.replace(/^module\//, ""); // an expanded module box is now its cluster
  return (
    byTitle("node", name) ||
    byTitle("edge", name.replace(/\s*->\s*/, "->")) ||
    (marker && byTitle("node", marker)) ||
    (edge && byTitle("edge", edge)) ||
    byTitle("node", `module/${path}`) ||
    byTitle("cluster", `cluster_${path}`) ||
    null
  );
}

function showSelected(view, model) {
  clearMarks(view, "qviz-selected");
  const element = findSelected(view, model, model.get("selected"));
  if (!element || !view.fitted) return;
  element.classList.add("qviz-selected");
  const box = boxOf(view, element);
  outline(view, box, "qviz-selected-outline");
  if (!isVisible(view, box)) centre(view, box);
}

function matches(view, query) {
  const q = query.trim().toLowerCase();
  if (!q) return [];
  return groups(view, "node").filter((g) => {
    const title = titleOf(g);
    if (title === "legend") return false;
    const text = [...g.querySelectorAll("text")].map((t) => t.textContent).join(" ");
    const name = title.startsWith("obs/") ? "" : title; // a marker matches by its label
    return name.toLowerCase().includes(q) || text.toLowerCase().includes(q);
  });
}

function showSearch(view, ui, query, advance) {
  clearMarks(view, "qviz-match");
  const found = view.fitted ? matches(view, query) : [];
  ui.count.textContent = query.trim() ? `${found.length} match${found.length === 1 ? "" : "es"}` : "";
  if (!found.length) return;
  for (const g of found) {
    g.classList.add("qviz-match");
    outline(view, boxOf(view, g), "qviz-match-outline");
  }
  view.matchIndex = advance ? (view.matchIndex + 1) % found.length : 0;
  centre(view, boxOf(view, found[view.matchIndex]));
}

// ---- clicks -----------------------------------------------------------------------------------

// What a click on `group` sets: {selected, module} (either may be absent).
// An arrow into or out of an observer marker selects the plan edge it draws (`edgeRefs`).
function clickResult(group, refs, edgeRefs) {
  const title = titleOf(group);
  const kind = kindOf(group);
  if (kind === "cluster") return { module: title.replace(/^cluster_/, "") };
  if (kind === "edge") {
    if (edgeRefs[title]) return { selected: edgeRefs[title] };
    const at = title.indexOf("->");
    return { selected: at < 0 ? title : `${title.slice(0, at)} -> ${title.slice(at + 2)}` };
  }
  if (title === "legend") return {};
  if (title.startsWith("module/")) return { selected: title, module: title.slice(7) };
  return { selected: refs[title] && refs[title].length ? refs[title][0] : title };
}

function onClick(view, model, event) {
  if (view.dragged || !view.g) return;
  const group = event.target.closest(CLICKABLE);
  if (!group || !view.g.contains(group)) return;
  const refs = model.get("_marker_refs") || {};
  const { selected, module } = clickResult(group, refs, model.get("_edge_refs") || {});
  if (selected !== undefined) {
    view.clicked = { name: selected, element: group };
    model.set("selected", selected);
  }
  if (module !== undefined) {
    const n = ((model.get("module_click") || {}).n || 0) + 1;
    model.set("module_click", { path: module, n });
  }
  model.save_changes();
}

// ---- the widget -------------------------------------------------------------------------------

function render({ model, el }) {
  const ui = buildChrome(el);
  addSplitter(el, ui.root);
  const view = { viewport: ui.viewport, k: 1, tx: 0, ty: 0, fitted: false, matchIndex: 0, el };
  view.panelWidth = () => model.get("panel_width") || 0;
  view.legendButton = ui.legend;
  Object.defineProperty(view, "resized", { get: () => Boolean(el.qvizResized) });
  ui.legend.addEventListener("click", () => showLegend(view, !view.legendBox));
  const refresh = () => {
    showSelected(view, model);
    showSearch(view, ui, model.get("search"), false);
  };
  const ensureFitted = () => {
    if (!view.fitted && fit(view)) refresh();
  };
  // Until the user pans or zooms, a pane that changes size (the notebook settling its layout,
  // the splitter dragged) opens the graph again for the new size.
  const onResize = () => {
    if (view.fitted && !view.touched) view.fitted = false;
    ensureFitted();
  };
  const draw = () => {
    placeSvg(view, model.get("svg"));
    ensureFitted();
  };
  const onHeight = () => {
    ui.viewport.style.height = model.get("height") || ""; // "": the style sheet's height
  };
  const onSearch = () => {
    if (ui.input.value !== model.get("search")) ui.input.value = model.get("search");
    showSearch(view, ui, model.get("search"), false);
  };
  const onSelected = () => showSelected(view, model);

  ui.input.value = model.get("search");
  ui.input.addEventListener("input", () => {
    model.set("search", ui.input.value);
    model.save_changes();
  });
  ui.input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") showSearch(view, ui, ui.input.value, true);
  });
  ui.zoomIn.addEventListener("click", () => zoomCentre(view, ZOOM_STEP));
  ui.zoomOut.addEventListener("click", () => zoomCentre(view, 1 / ZOOM_STEP));
  ui.reset.addEventListener("click", () => {
    view.touched = false; // the pane's next resize opens the graph afresh
    fit(view, true);
  });
  const pan = panHandlers(view);
  ui.viewport.addEventListener("pointerdown", pan.down);
  ui.viewport.addEventListener("pointermove", pan.move);
  ui.viewport.addEventListener("pointerup", pan.up);
  ui.viewport.addEventListener("pointercancel", pan.up);
  ui.viewport.addEventListener("wheel", (event) => onWheel(view, event), { passive: false });
  ui.viewport.addEventListener("click", (event) => onClick(view, model, event));
  const resize = new ResizeObserver(onResize); // the view may render before it is attached
  resize.observe(ui.viewport);
  // the row beside the panel grew or shrank (the window): the pane's widening follows it
  view.rowObserver = new ResizeObserver(() => widenPane(view));

  const listeners = { "change:svg": draw, "change:selected": onSelected, "change:search": onSearch, "change:height": onHeight };
  for (const [name, callback] of Object.entries(listeners)) model.on(name, callback);
  onHeight();
  draw();
  return () => {
    resize.disconnect();
    view.rowObserver.disconnect();
    for (const [name, callback] of Object.entries(listeners)) model.off(name, callback);
  };
}

export default { render };
