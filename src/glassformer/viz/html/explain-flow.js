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
