// glassformer's explorable forward pass: the flow drawings. The model: the residual stream as
// a band from the embeddings to the output with each block on it (a translator: the
// encoder's band beside the decoder's, the encoder's output flowing into every decoder
// block's cross-attention). A block: the stream down the left, each sub-layer a branch that
// leaves it and is added back (⊕). Every place is a node with data-go: a click descends.
"use strict";

const FLOW = { node: 34, gap: 14, width: 230, band: 16 };
const stepCount = (n) => `${n} step${n === 1 ? "" : "s"}`;
const COLOURS = { encoder: "#cfe8d5", decoder: "#cfe0f5", stream: "#cfe0f5", cross: "#e8a33d" };

function flowNode(page, x, y, label, detail, go) {
  const g = svg("g", { class: "node", "data-go": go, tabindex: 0, role: "button" });
  g.append(svg("rect", { x, y, width: FLOW.width, height: FLOW.node, rx: 6 }));
  g.append(svg("text", { x: x + 10, y: y + 15 }, label));
  g.append(svg("text", { x: x + 10, y: y + 28, class: "detail" }, detail));
  page.append(g);
}

function band(page, x, top, bottom, colour) {
  page.append(svg("rect", { x: x - FLOW.band / 2, y: top, width: FLOW.band, height: bottom - top, fill: colour }));
}

// The model: one column of places, or a translator's two.
function drawModelFlow(page, places) {
  const stacks = ["encoder", "decoder"].filter((s) => places.some((p) => p.label.startsWith(s)));
  const columns = stacks.length ? stacks.map((s) => places.filter((p) => p.label.startsWith(s))) : [places];
  const output = stacks.length ? places.filter((p) => !stacks.some((s) => p.label.startsWith(s))) : [];
  if (output.length) columns[columns.length - 1].push(...output);
  const step = FLOW.node + FLOW.gap;
  const height = 50 + Math.max(...columns.map((c) => c.length)) * step;
  sizePage(page, 40 + columns.length * (FLOW.width + 90), height, 12);
  columns.forEach((column, i) => {
    const x = 20 + i * (FLOW.width + 90);
    const centre = x + FLOW.width / 2;
    const colour = COLOURS[stacks[i]] || COLOURS.stream;
    band(page, centre, 20 + FLOW.node / 2, 20 + (column.length - 1) * step + FLOW.node / 2, colour);
    page.append(svg("text", { x: centre, y: 12, "text-anchor": "middle", class: "detail" },
      stacks[i] ? `the ${stacks[i]}: its residual stream` : "the residual stream"));
    column.forEach((p, j) => flowNode(page, x, 20 + j * step, p.label, stepCount(p.count), p.go));
  });
  if (columns.length === 1) drawStreamWidths(page, places, 20 + FLOW.width + 24, step);
  if (columns.length === 2) { // the encoder's output is the memory every cross-attention reads
    const from = [20 + FLOW.width, 20 + (columns[0].length - 1) * step + FLOW.node / 2];
    const x = 20 + FLOW.width + 90;
    columns[1].forEach((p, j) => {
      if (!p.label.includes("block")) return;
      const y = 20 + j * step + FLOW.node / 2;
      page.append(svg("path", { d: `M${from[0]},${from[1]} C${x - 40},${from[1]} ${x - 50},${y} ${x},${y}`,
        fill: "none", stroke: COLOURS.cross, "stroke-width": 2, class: "memory" }));
    });
    page.append(svg("text", { x: 22, y: from[1] + FLOW.node / 2 + 14, class: "detail" },
      "↳ the memory every cross-attention reads"));
  }
}

// Beside each place of a one-stack model, the stream there as one lane per token, each as
// tall as that position's vector is long (its norm, on one scale for the whole model): the
// stream entering the first block, leaving each block, and entering the output.
function drawStreamWidths(page, places, x0, step) {
  const whole = (s) => s && s.shown.join() === s.shape.join(); // not thinned: a true norm
  const named = (name) => data.steps.find((s) => s.name === name);
  const at = (place) => {
    if (place === "embedding") return named("blocks.0.hook_resid_pre");
    if (place === "output") return [...data.steps].reverse().find((s) => s.name.endsWith("hook_resid_post"));
    const block = /^block (\d+)$/.exec(place);
    return block ? named(`blocks.${block[1]}.hook_resid_post`) : null;
  };
  const found = places.map((p) => at(p.label));
  if (!found.every(whole)) return;
  const norms = found.map((s) => {
    const v = stepValues(s.index);
    const [T, D] = s.shown.length === 2 ? s.shown : [1, s.shown[0]];
    return Array.from({ length: T }, (_, t) => Math.hypot(...v.subarray(t * D, (t + 1) * D)));
  });
  const peak = Math.max(1e-12, ...norms.flat());
  const lane = Math.max(3, Math.min(14, Math.floor(360 / norms[0].length)));
  const group = svg("g", { id: "stream-widths" });
  group.append(svg("text", { x: x0, y: 12, class: "detail" }, "each token's stream: its length (norm)"));
  norms.forEach((row, j) => {
    const y = 20 + j * step;
    row.forEach((n, t) => {
      const h = Math.max(1, (n / peak) * FLOW.node);
      const r = svg("rect", { x: x0 + t * lane, y: y + FLOW.node - h, width: lane - 1, height: h, fill: "#7a9cc6",
        "data-place": j, "data-token": t, "data-norm": n });
      r.append(svg("title", {}, `${places[j].label}, ${data.tokens[t] ?? t}: ${n.toFixed(3)}`));
      group.append(r);
    });
  });
  page.append(group);
  const label = 200; // the label's width: a few tokens' bars must not cut it
  const width = Math.max(Number(page.getAttribute("width")), x0 + Math.max(norms[0].length * lane, label) + 20);
  page.setAttribute("width", String(width));
  page.setAttribute("viewBox", `0 0 ${width} ${page.getAttribute("height")}`);
}

// A block: the stream, and each sub-layer as a branch added back to it.
function drawBlockFlow(page, parts) {
  const step = FLOW.node + FLOW.gap + 10;
  sizePage(page, 80 + FLOW.width + 260, 40 + parts.length * step, 12);
  const x = 40;
  band(page, x, 10, 30 + parts.length * step, COLOURS.stream);
  parts.forEach((p, j) => {
    const y = 20 + j * step;
    const input = p.label.endsWith("its input");
    if (input) {
      flowNode(page, x + 40, y, p.label, `${stepCount(p.count)}: the stream as it comes in`, p.go);
      return;
    }
    page.append(svg("path", { d: `M${x},${y + 6} H${x + 40}`, stroke: "#5b6673", fill: "none" }));
    flowNode(page, x + 40, y, p.label, stepCount(p.count), p.go);
    page.append(svg("path", { d: `M${x + 40 + FLOW.width},${y + FLOW.node / 2} h20 v${FLOW.node / 2 + 10} H${x + 9}`,
      stroke: "#5b6673", fill: "none" }));
    page.append(svg("text", { x, y: y + FLOW.node + 14, "text-anchor": "middle", class: "plus" }, "⊕"));
    if (p.label === "cross-attention") {
      const right = x + 40 + FLOW.width;
      page.append(svg("path", { d: `M${right + 170},${y + 8} H${right + 4}`, stroke: COLOURS.cross,
        "stroke-width": 2, fill: "none", class: "memory" }));
      page.append(svg("text", { x: right + 30, y: y + 4, class: "detail" }, "keys, values: the encoder's output"));
    }
  });
}
