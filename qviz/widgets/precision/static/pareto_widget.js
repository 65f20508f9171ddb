// qviz ParetoWidget front end: shows a Pareto plot drawn as SVG in Python (matplotlib) and
// reports which front point the user clicks. Plain ES module for anywidget: no dependencies, no
// build step, nothing fetched from the network.
//
// Front point i is the SVG element with id "qviz-point-<i>". A click anywhere on the plot picks
// the point nearest to the pointer, within PICK_PX pixels, so close points stay pickable; the
// pick is sent back as picked = {index, n}, n counting clicks (the same point twice fires twice).

const PREFIX = "qviz-point-";
const PICK_PX = 24;

function points(root) {
  return [...root.querySelectorAll(`[id^="${PREFIX}"]`)];
}

function indexOf(element) {
  return Number(element.id.slice(PREFIX.length));
}

// The front point whose centre is nearest to (x, y) in client pixels, or null past PICK_PX.
function nearest(root, x, y) {
  let best = null;
  let bestDistance = PICK_PX;
  for (const element of points(root)) {
    const box = element.getBoundingClientRect();
    if (!box.width && !box.height) continue;
    const distance = Math.hypot(box.left + box.width / 2 - x, box.top + box.height / 2 - y);
    if (distance < bestDistance) {
      best = element;
      bestDistance = distance;
    }
  }
  return best;
}

function place(root, model) {
  root.innerHTML = model.get("svg") || "";
  const svg = root.querySelector("svg");
  if (!svg) {
    root.textContent = "no plot";
    return;
  }
  svg.removeAttribute("width"); // the viewBox stays: the plot scales with its pane
  svg.removeAttribute("height");
  svg.classList.add("qviz-pareto-svg");
  const labels = model.get("labels") || [];
  for (const element of points(root)) {
    element.classList.add("qviz-point");
    const label = labels[indexOf(element)];
    if (label) {
      const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
      title.textContent = label;
      element.prepend(title);
    }
  }
}

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "qviz-pareto";
  el.appendChild(root);
  const draw = () => place(root, model);
  root.addEventListener("click", (event) => {
    const hit = nearest(root, event.clientX, event.clientY);
    if (!hit) return;
    const n = ((model.get("picked") || {}).n || 0) + 1;
    model.set("picked", { index: indexOf(hit), n });
    model.save_changes();
  });
  root.addEventListener("pointermove", (event) => {
    root.classList.toggle("qviz-pareto-near", nearest(root, event.clientX, event.clientY) !== null);
  });
  const listeners = { "change:svg": draw, "change:labels": draw };
  for (const [name, callback] of Object.entries(listeners)) model.on(name, callback);
  draw();
  return () => {
    for (const [name, callback] of Object.entries(listeners)) model.off(name, callback);
  };
}

export default { render };
