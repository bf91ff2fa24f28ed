// glassformer's attribution-graph page: the pruned graph of one text, drawn by layer and
// position; a node's contexts, edges and interventions in the side panel; supernodes.
// Classic script after helpers.js. Text from the data enters the page only as textContent.
"use strict";

const GRAPH = JSON.parse($("graph-data").textContent);
const NODES = GRAPH.nodes.map((node, index) => ({ ...node, index }));
const EDGES = GRAPH.edges.map(([source, target, weight]) => ({ source, target, weight }));
const MAX_WEIGHT = Math.max(1e-12, ...EDGES.map((e) => Math.abs(e.weight)));
const COLUMN = 120, ROW = 28, LEFT = 86, TOP = 28, BOTTOM = 40;
const state = { focus: null, selected: new Set(), groups: [], showErrors: true };

// An edge's stroke width in pixels: 0.4 plus up to 4 for the largest weight in the page.
function edgeWidth(weight) {
  return 0.4 + (4 * Math.abs(weight)) / MAX_WEIGHT;
}

// Rows: tokens at the bottom (row 0), layers 0 … L-1 above them, the logits at the top.
function rowOf(node) {
  if (node.kind === "token") return 0;
  if (node.kind === "logit") return GRAPH.layers + 1;
  return node.layer + 1;
}

function layout() {
  const cells = new Map();
  NODES.forEach((node, i) => {
    const key = `${rowOf(node)}:${node.pos}`;
    if (!cells.has(key)) cells.set(key, []);
    cells.get(key).push(i);
  });
  const height = TOP + (GRAPH.layers + 2) * ROW + BOTTOM;
  for (const members of cells.values()) {
    members.sort((a, b) => (NODES[b].influence || 0) - (NODES[a].influence || 0));
    const step = Math.min(14, (COLUMN - 16) / Math.max(1, members.length));
    members.forEach((i, k) => {
      const node = NODES[i];
      const centre = LEFT + node.pos * COLUMN + COLUMN / 2;
      node.x = centre + (k - (members.length - 1) / 2) * step;
      node.y = height - BOTTOM - rowOf(node) * ROW - ROW / 2;
    });
  }
  return { width: LEFT + GRAPH.tokens.length * COLUMN + 10, height };
}

function visible(i) {
  return state.showErrors || NODES[i].kind !== "error";
}

function drawNode(page, node, i) {
  const attrs = { class: "node", "data-index": i, "data-kind": node.kind };
  let shape;
  if (node.kind === "feature") {
    shape = svg("circle", { ...attrs, cx: node.x, cy: node.y, r: 5, fill: "#2b8cbe" });
  } else if (node.kind === "error") {
    shape = svg("rect", { ...attrs, x: node.x - 4, y: node.y - 4, width: 8, height: 8,
                          fill: "#969696" });
  } else {
    shape = svg("rect", { ...attrs, x: node.x - 6, y: node.y - 6, width: 12, height: 12,
                          fill: node.kind === "logit" ? "#e6550d" : "#31a354" });
  }
  shape.append(svg("title", {}, node.label || node.id));
  shape.addEventListener("click", (event) => choose(i, event.shiftKey));
  page.append(shape);
}

function drawAxes(page, size) {
  for (let row = 0; row < GRAPH.layers + 2; row++) {
    const y = size.height - BOTTOM - row * ROW - ROW / 2;
    const name = row === 0 ? "tokens" : row === GRAPH.layers + 1 ? "logits" : `layer ${row - 1}`;
    page.append(svg("text", { x: 4, y: y + 4, fill: "#55606e" }, name));
    page.append(svg("line", { x1: LEFT, x2: size.width, y1: y, y2: y, stroke: "#f0f2f5" }));
  }
  GRAPH.tokens.forEach((token, pos) => {
    page.append(svg("text", { x: LEFT + pos * COLUMN + COLUMN / 2, y: size.height - 14,
                              "text-anchor": "middle", class: "token" }, token));
  });
}

function draw() {
  const page = $("graph-svg");
  const size = layout();
  sizePage(page, size.width, size.height);
  drawAxes(page, size);
  const near = state.focus === null ? null : neighbours(state.focus);
  for (const edge of EDGES) {
    if (!visible(edge.source) || !visible(edge.target)) continue;
    const a = NODES[edge.source], b = NODES[edge.target];
    const line = svg("line", {
      class: "edge", x1: a.x, y1: a.y, x2: b.x, y2: b.y,
      stroke: edge.weight >= 0 ? "#d6604d" : "#4393c3", "stroke-opacity": 0.4,
      "stroke-width": edgeWidth(edge.weight).toFixed(3),
      "data-source": edge.source, "data-target": edge.target, "data-weight": edge.weight,
    });
    if (near && edge.source !== state.focus && edge.target !== state.focus) {
      line.classList.add("dim");
    }
    page.append(line);
  }
  NODES.forEach((node, i) => visible(i) && drawNode(page, node, i));
  for (const [k, group] of state.groups.entries()) drawGroup(page, group, k);
  for (const shape of page.querySelectorAll(".node")) {
    const i = Number(shape.getAttribute("data-index"));
    if (state.selected.has(i)) shape.classList.add("selected");
    if (i === state.focus) shape.classList.add("focus");
    if (near && !near.has(i)) shape.classList.add("dim");
  }
}

function drawGroup(page, group, k) {
  const xs = group.map((i) => NODES[i].x), ys = group.map((i) => NODES[i].y);
  const box = svg("rect", { class: "group", x: Math.min(...xs) - 9, y: Math.min(...ys) - 9,
                            width: Math.max(...xs) - Math.min(...xs) + 18,
                            height: Math.max(...ys) - Math.min(...ys) + 18 });
  box.style.cursor = "pointer";
  box.style.pointerEvents = "stroke";
  box.addEventListener("click", () => showGroup(k));
  page.append(box);
  page.append(svg("text", { x: Math.min(...xs) - 9, y: Math.min(...ys) - 12, fill: "#6a3d9a" },
                  `supernode ${k + 1}`));
}

function neighbours(i) {
  const near = new Set([i]);
  for (const e of EDGES) {
    if (e.source === i) near.add(e.target);
    if (e.target === i) near.add(e.source);
  }
  return near;
}

function choose(i, add) {
  if (add) {
    if (state.selected.has(i)) state.selected.delete(i); else state.selected.add(i);
  } else {
    state.focus = state.focus === i ? null : i;
  }
  draw();
  showNode(i);
}

function edgeTable(rows, heading) {
  const box = document.createElement("div");
  box.append(tag("h3", heading));
  const table = document.createElement("table");
  for (const { other, weight } of rows.slice(0, 12)) {
    const tr = document.createElement("tr");
    tr.append(tag("td", NODES[other].label || NODES[other].id), tag("td", weight.toFixed(3), "num"));
    tr.addEventListener("click", () => choose(other, false));
    table.append(tr);
  }
  if (!rows.length) box.append(tag("p", "none kept"));
  box.append(table);
  return box;
}

function contextsOf(node) {
  const box = document.createElement("div");
  if (!node.contexts || !node.contexts.length) return box;
  box.append(tag("h3", `top contexts (${GRAPH.corpus})`));
  for (const [before, token, after, value] of node.contexts) {
    const p = tag("p", undefined, "context");
    p.append(document.createTextNode(`${value.toFixed(2)}  …${before}`), tag("mark", token),
             document.createTextNode(`${after}…`));
    box.append(p);
  }
  return box;
}

function interventionOf(node) {
  const box = document.createElement("div");
  for (const run of GRAPH.interventions) {
    if (!run.at.includes(node.index)) continue;
    box.append(tag("h3", run.what));
    const table = document.createElement("table");
    run.before.forEach(([token, p], k) => {
      const after = run.after[k];
      const tr = document.createElement("tr");
      tr.append(tag("td", token), tag("td", p.toFixed(3), "num"), tag("td", "→"),
                tag("td", after[0]), tag("td", after[1].toFixed(3), "num"));
      table.append(tr);
    });
    box.append(table);
  }
  return box;
}

function showNode(i) {
  const node = NODES[i];
  $("panel-title").textContent = node.label || node.id;
  const facts = [`${node.kind}`, node.kind === "token" ? "" : `layer ${node.layer}`,
                 `position ${node.pos} (${GRAPH.tokens[node.pos]})`];
  if (node.activation !== null && node.activation !== undefined) {
    facts.push(`activation ${node.activation.toFixed(3)}`);
  }
  if (node.influence !== null && node.influence !== undefined) {
    facts.push(`cumulative influence ${node.influence.toFixed(3)}`);
  }
  const into = EDGES.filter((e) => e.target === i).map((e) => ({ other: e.source, weight: e.weight }));
  const out = EDGES.filter((e) => e.source === i).map((e) => ({ other: e.target, weight: e.weight }));
  const byWeight = (a, b) => Math.abs(b.weight) - Math.abs(a.weight);
  $("panel-body").replaceChildren(tag("p", facts.filter(Boolean).join(" · ")), contextsOf(node),
    interventionOf(node), edgeTable(into.sort(byWeight), "edges in"),
    edgeTable(out.sort(byWeight), "edges out"));
}

function showGroup(k) {
  const group = new Set(state.groups[k]);
  const sums = (end, other) => {
    const total = new Map();
    for (const e of EDGES) {
      if (group.has(e[end]) && !group.has(e[other])) {
        total.set(e[other], (total.get(e[other]) || 0) + e.weight);
      }
    }
    return [...total].map(([node, weight]) => ({ other: node, weight }))
      .sort((a, b) => Math.abs(b.weight) - Math.abs(a.weight));
  };
  $("panel-title").textContent = `supernode ${k + 1}: ${group.size} nodes`;
  $("panel-body").replaceChildren(
    tag("p", [...group].map((i) => NODES[i].label || NODES[i].id).join("; ")),
    edgeTable(sums("target", "source"), "edges in (summed)"),
    edgeTable(sums("source", "target"), "edges out (summed)"));
}

function init() {
  $("subtitle").textContent = GRAPH.prompt;
  const score = (v) => (v === null ? "n/a" : v.toFixed(3));
  $("scores").textContent = `replacement ${score(GRAPH.scores.replacement)} · ` +
    `completeness ${score(GRAPH.scores.completeness)}`;
  $("footer").textContent = GRAPH.footer;
  $("show-errors").addEventListener("change", (event) => {
    state.showErrors = event.target.checked;
    draw();
  });
  $("group").addEventListener("click", () => {
    if (state.selected.size > 1) state.groups.push([...state.selected]);
    state.selected.clear();
    draw();
  });
  $("ungroup").addEventListener("click", () => {
    state.groups = [];
    draw();
  });
  state.groups = (GRAPH.supernodes || []).map((ids) =>
    ids.map((id) => NODES.findIndex((n) => n.id === id)).filter((i) => i >= 0));
  draw();
  document.body.dataset.ready = "1";
}

init();
