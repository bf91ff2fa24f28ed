// glassformer's circuit page: a model's components by layer, the top-scoring edges between
// them for the circuit size the slider chooses, the faithfulness curve beside it.
// Classic script after helpers.js. Text from the data enters the page only as textContent.
"use strict";

const DATA = JSON.parse($("circuit-data").textContent);
const NODES = DATA.nodes;
const EDGES = DATA.edges.map(([source, target, reads, score]) => ({ source, target, reads, score }));
const MAX_SCORE = Math.max(1e-12, ...EDGES.map((e) => Math.abs(e.score)));
const COLUMN = 56, ROW = 30, LEFT = 70, TOP = 24, BOTTOM = 24;
const COLOURS = { main: "#d7301f", eap: "#2171b5", random: "#969696" };
const state = { size: 0, focus: null };

// An edge's stroke width in pixels: 0.4 plus up to 4 for the largest score in the page; its
// opacity from 0.15 to 0.9 alike, so that the strong edges of a large circuit stand out.
function edgeWidth(score) {
  return 0.4 + (4 * Math.abs(score)) / MAX_SCORE;
}

function edgeOpacity(score) {
  return 0.15 + (0.75 * Math.abs(score)) / MAX_SCORE;
}

// Rows: the embeddings (row 0), the layers 0 … L-1, the logits at the top; in a layer's row
// the heads in order, then the MLP.
function place(node) {
  const height = TOP + (DATA.layers + 2) * ROW + BOTTOM;
  const row = node.kind === "embed" ? 0 : node.kind === "logits" ? DATA.layers + 1 : node.layer + 1;
  const middle = LEFT + ((DATA.heads + 1) * COLUMN) / 2;
  const column = node.kind === "head" ? node.head : node.kind === "mlp" ? DATA.heads + 0.4 : null;
  node.x = column === null ? middle : LEFT + column * COLUMN + COLUMN / 2;
  node.y = height - BOTTOM - row * ROW - ROW / 2;
  return height;
}

function shownEdges() {
  return EDGES.slice(0, Math.min(DATA.sizes[state.size], EDGES.length));
}

function draw() {
  const page = $("circuit-svg");
  let height = 0;
  for (const node of NODES) height = place(node);
  sizePage(page, LEFT + (DATA.heads + 1.6) * COLUMN + 20, height);
  for (let layer = 0; layer < DATA.layers; layer++) {
    const y = height - BOTTOM - (layer + 1) * ROW - ROW / 2 + 4;
    page.append(svg("text", { x: 8, y, fill: "#55606e" }, `layer ${layer}`));
  }
  const edges = shownEdges();
  const touched = new Set();
  for (const edge of edges) {
    touched.add(edge.source);
    touched.add(edge.target);
    const a = NODES[edge.source], b = NODES[edge.target];
    const dim = state.focus !== null && edge.source !== state.focus && edge.target !== state.focus;
    const bend = (b.x - a.x) * 0.15;
    page.append(svg("path", {
      class: dim ? "edge dim" : "edge", "data-score": edge.score,
      d: `M${a.x},${a.y} C${a.x + bend},${(a.y + b.y) / 2} ${b.x - bend},${(a.y + b.y) / 2} ${b.x},${b.y}`,
      stroke: edge.score >= 0 ? "#d7301f" : "#2171b5", "stroke-width": edgeWidth(edge.score),
      "stroke-opacity": edgeOpacity(edge.score),
    }));
  }
  NODES.forEach((node, i) => {
    const off = touched.has(i) ? "" : " off";
    const focus = state.focus === i ? " focus" : "";
    const r = node.kind === "head" ? 6 : 8;
    const shape = node.kind === "head"
      ? svg("circle", { cx: node.x, cy: node.y, r, fill: "#2b8cbe" })
      : svg("rect", { x: node.x - r, y: node.y - r, width: 2 * r, height: 2 * r,
                      fill: node.kind === "mlp" ? "#31a354" : "#e6550d" });
    shape.setAttribute("class", `node${off}${focus}`);
    shape.addEventListener("click", () => { state.focus = state.focus === i ? null : i; update(); });
    shape.append(svg("title", {}, node.id));
    page.append(shape);
  });
}

function figures() {
  const i = state.size;
  const rows = [["circuit", "edges", "faithfulness"]];
  for (const method of DATA.methods) {
    rows.push([method.name, String(DATA.sizes[i]), fmt(method.absolute[i])]);
  }
  const table = tag("table");
  rows.forEach((row, k) => {
    const tr = tag("tr");
    row.forEach((cell, j) => tr.append(tag(k === 0 ? "th" : "td", cell, j ? "num" : "")));
    table.append(tr);
  });
  const summary = tag("table");
  summary.append(...[["", "CPR ↑", "CMD ↓"], ...DATA.methods.map((m) => [m.name, fmt(m.cpr), fmt(m.cmd)])]
    .map((row, k) => {
      const tr = tag("tr");
      row.forEach((cell, j) => tr.append(tag(k === 0 ? "th" : "td", cell, j ? "num" : "")));
      return tr;
    }));
  $("figures").replaceChildren(table, tag("p", "Over MIB's ten sizes:"), summary);
  $("size-label").textContent =
    `${DATA.sizes[i]} of ${DATA.real} edges (${(100 * DATA.fractions[i]).toPrecision(2)}%): ` +
    `faithfulness ${fmt(DATA.methods[0].absolute[i])}` +
    (DATA.sizes[i] > EDGES.length ? ` (the strongest ${EDGES.length} drawn)` : "");
}

function fmt(x) {
  return x === null || x === undefined ? "n/a" : Number(x).toFixed(3);
}

// The faithfulness of each method's circuits against the fraction of edges (log scale).
function curve() {
  const page = $("curve-svg");
  const W = 300, H = 190, L = 30, B = 28, T = 8, R = 20;
  sizePage(page, W, H, 10);
  const lo = Math.log10(DATA.fractions[0]), hi = Math.log10(DATA.fractions.at(-1));
  const values = DATA.methods.flatMap((m) => m.absolute).filter((v) => v !== null);
  const top = Math.max(1.1, ...values), bottom = Math.min(0, ...values);
  const x = (f) => L + ((Math.log10(f) - lo) / (hi - lo)) * (W - L - R);
  const y = (v) => T + ((top - v) / (top - bottom)) * (H - T - B);
  for (const v of [0, 1]) {
    page.append(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#ccc" }));
    page.append(svg("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end" }, String(v)));
  }
  DATA.fractions.forEach((f, k) => {
    if (k % 3 === 0 || k === DATA.fractions.length - 1) {
      page.append(svg("text", { x: x(f), y: H - 12, "text-anchor": "middle" }, `${100 * f}%`));
    }
  });
  page.append(svg("text", { x: (W + L) / 2, y: H - 1, "text-anchor": "middle" }, "edges in the circuit"));
  DATA.methods.forEach((method, m) => {
    const colour = [COLOURS.main, COLOURS.eap, COLOURS.random][m] || "#000";
    const points = method.absolute.map((v, k) => `${x(DATA.fractions[k])},${y(v)}`).join(" ");
    page.append(svg("polyline", { points, fill: "none", stroke: colour, "stroke-width": 1.6 }));
    page.append(svg("text", { x: L + 6, y: T + 10 + 12 * m, fill: colour }, method.name));
  });
  const f = DATA.fractions[state.size];
  page.append(svg("line", { x1: x(f), x2: x(f), y1: T, y2: H - B, stroke: "#111",
                            "stroke-dasharray": "3 2" }));
}

function panel() {
  const title = $("panel-title"), body = $("panel-body");
  if (state.focus === null) {
    title.textContent = "Click a component";
    body.replaceChildren(tag("p", "Its edges in this circuit, in and out, with their scores."));
    return;
  }
  const node = NODES[state.focus];
  title.textContent = `${node.id}: score ${fmt(node.score)}`;
  const table = tag("table");
  for (const edge of shownEdges()) {
    if (edge.source !== state.focus && edge.target !== state.focus) continue;
    const tr = tag("tr");
    const other = edge.source === state.focus ? `→ ${NODES[edge.target].id}` : `${NODES[edge.source].id} →`;
    tr.append(tag("td", `${other} (${edge.reads})`), tag("td", fmt(edge.score), "num"));
    table.append(tr);
  }
  body.replaceChildren(table);
}

function update() {
  draw();
  figures();
  curve();
  panel();
}

$("subtitle").textContent = DATA.subtitle;
$("footer").textContent = DATA.footer;
const slider = $("size");
slider.max = String(DATA.sizes.length - 1);
state.size = DATA.initial;
slider.value = String(state.size);
slider.addEventListener("input", () => { state.size = Number(slider.value); update(); });
update();
document.body.dataset.ready = "1";
