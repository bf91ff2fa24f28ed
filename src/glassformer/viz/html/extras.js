// glassformer's viewer: the attribution, features and directions tabs (glassformer attribute,
// glassformer features and glassformer attention --vector write them), drawn from
// data.attribution, data.features and data.directions. Text
// from the model (tokens, contexts) is only ever put into the page as text.
"use strict";

// A value in [-1, 1] as a colour: red for positive, blue for negative, white at zero.
function diverging(v) {
  const t = Math.max(-1, Math.min(1, v));
  const [r, g, b] = t >= 0 ? [178, 24, 43] : [33, 102, 172];
  const a = Math.abs(t);
  const mix = (c) => Math.round(255 + (c - 255) * a);
  return `rgb(${mix(r)},${mix(g)},${mix(b)})`;
}

// rows × columns of cells, coloured by colour(value, row, column); the first row at the
// bottom (layers), or at the top (topDown)
function heatmap(page, x0, y0, rows, columns, values, colour, cellW, cellH, id, topDown = false) {
  const group = svg("g", { id });
  for (let r = 0; r < rows.length; r++) {
    const y = y0 + (topDown ? r : rows.length - 1 - r) * cellH;
    group.append(svg("text", { x: x0 - 6, y: y + cellH * 0.7, "text-anchor": "end", "data-row": r }, rows[r]));
    for (let c = 0; c < columns.length; c++) {
      const cell = svg("rect", {
        x: x0 + c * cellW, y, width: cellW - 1, height: cellH - 1, fill: colour(values[r][c], r, c),
        "data-row": r, "data-col": c, "data-value": values[r][c],
      });
      cell.append(svg("title", {}, `${rows[r]}, ${columns[c]}: ${values[r][c].toFixed(4)}`));
      group.append(cell);
    }
  }
  for (let c = 0; c < columns.length; c++) {
    const x = x0 + c * cellW + cellW / 2;
    const y = y0 + rows.length * cellH + 6;
    group.append(svg("text", { x, y, "text-anchor": "end", transform: `rotate(-60 ${x} ${y})` },
      columns[c].slice(0, 16)));
  }
  page.append(group);
}

// A bar per token, up (red) or down (blue) from a middle line, its height |value| / scale;
// a value beyond the scale is drawn to the full height and outlined. Tokens below, slanted.
function barTrack(page, id, tokens, values, left, cellW, bars, scale) {
  const mid = 10 + bars / 2;
  const group = svg("g", { id });
  for (let t = 0; t < tokens.length; t++) {
    const v = values[t];
    const beyond = Math.abs(v) > scale;
    const h = Math.min(1, Math.abs(v) / scale) * (bars / 2 - 6);
    const bar = svg("rect", {
      x: left + t * cellW + 4, y: v >= 0 ? mid - h : mid, width: cellW - 8, height: Math.max(h, 0.5),
      fill: v >= 0 ? "#b2182b" : "#2166ac", "data-token": t, "data-value": v,
      stroke: beyond ? "#000" : "none", "stroke-dasharray": beyond ? "3 2" : "none",
    });
    bar.append(svg("title", {}, `${tokens[t]}: ${v.toFixed(4)}${beyond ? " (beyond the scale)" : ""}`));
    group.append(bar);
    const x = left + t * cellW + cellW / 2;
    group.append(svg("text", { x, y: bars + 24, "text-anchor": "end", transform: `rotate(-60 ${x} ${bars + 24})` },
      tokens[t].slice(0, 16)));
  }
  group.append(svg("line", { x1: left, x2: left + tokens.length * cellW, y1: mid, y2: mid, stroke: "#555" }));
  page.append(group);
}

// ---- attribution ----------------------------------------------------------------------

function drawAttribution() {
  const A = data.attribution;
  const page = $("attribution-svg");
  const T = A.tokens.length;
  const cellW = 46;
  const cellH = 18;
  const left = 80;
  const bars = 120;
  const grid = A.grid || [];
  const heads = A.heads || [];
  const gridTop = bars + 130;
  const width = left + T * cellW + (heads.length ? 120 + heads[0].length * cellW : 0) + 20;
  const height = gridTop + grid.length * cellH + 100;
  sizePage(page, width, A.grid ? height : bars + 110);
  // integrated gradients: a bar per token
  page.append(svg("text", { x: left, y: 10 }, `integrated gradients of ${A.metric}`));
  const peak = Math.max(1e-9, ...A.integrated.map(Math.abs));
  barTrack(page, "attribution-bars", A.tokens, A.integrated, left, cellW, bars, peak);
  if (!A.grid) {
    $("attribution-hint").textContent = "Integrated gradients: each token's share of the metric, from zero embeddings to the text's. (Give --corrupt for attribution patching.)";
    $("note").textContent = `attribution: ${T} tokens`;
    return;
  }
  const span = A.clean - A.corrupt;
  const share = (v) => (span ? (v - A.corrupt) / span : 0);
  const layers = grid.map((_, l) => `layer ${l + 1}`);
  page.append(svg("text", { x: left, y: gridTop - 14 }, "attribution patching: the residual stream entering each layer"));
  heatmap(page, left, gridTop, layers, A.tokens, grid, (v) => diverging(share(v)), cellW, cellH, "attribution-grid");
  const headsLeft = left + T * cellW + 120;
  page.append(svg("text", { x: headsLeft, y: gridTop - 14 }, "each head"));
  const headNames = heads[0].map((_, h) => `head ${h + 1}`);
  heatmap(page, headsLeft, gridTop, layers, headNames, heads, (v) => diverging(share(v)), cellW, cellH, "attribution-heads");
  $("attribution-hint").textContent = `Red: patching that place from the corrupted run to the clean one would bring the clean answer back (estimated from one backward pass; 1 = all the way: ${A.clean.toFixed(3)}, 0 = the corrupted ${A.corrupt.toFixed(3)}). Above: integrated gradients per token.`;
  $("note").textContent = `attribution: ${grid.length} layers × ${T} tokens, ${heads[0].length} heads`;
}

// ---- features -------------------------------------------------------------------------

function drawFeatures() {
  const F = data.features;
  const page = $("features-svg");
  const T = F.tokens.length;
  const cellW = 46;
  const cellH = 20;
  const left = 110;
  const rows = F.features.map((f) => `feature ${f}`);
  sizePage(page, left + T * cellW + 20, rows.length * cellH + 110);
  const values = F.features.map((_, j) => F.values.map((row) => row[j])); // (features, tokens)
  const peak = Math.max(1e-9, ...values.flat());
  for (let r = 0; r < rows.length; r++) {
    const y = 10 + r * cellH; // the strongest feature on top
    page.append(svg("rect", {
      x: 0, y, width: left - 2, height: cellH - 1, fill: r === state.feature ? "#dde8f6" : "transparent",
      "pointer-events": "none",
    }));
  }
  heatmap(page, left, 10, rows, F.tokens, values, (v) => `rgba(27,120,55,${v / peak})`, cellW, cellH, "features-grid", true);
  const list = $("feature-contexts");
  list.replaceChildren();
  const chosen = Math.min(state.feature, F.features.length - 1);
  for (const c of F.contexts[chosen] || []) {
    const item = tag("li", "");
    item.append(tag("span", `${c.value.toFixed(2)}  …${c.before}`));
    item.append(tag("mark", c.token));
    item.append(tag("span", `${c.after}…`));
    list.append(item);
  }
  $("note").textContent = `features: ${F.sae}; feature ${F.features[chosen]}'s top contexts below`;
}

// ---- directions -----------------------------------------------------------------------

// a row's scale: the 90th percentile of its magnitudes (an outsized value saturates)
function typical(row) {
  const sorted = row.map(Math.abs).sort((a, b) => a - b);
  return Math.max(1e-9, sorted[Math.floor(0.9 * (sorted.length - 1))]);
}

function drawDirections() {
  const D = data.directions;
  const page = $("directions-svg");
  const T = D.tokens.length;
  const cellW = 46;
  const cellH = 16;
  const left = 200;
  const bars = 120;
  const gridTop = bars + 130;
  sizePage(page, left + T * cellW + 20, gridTop + D.hooks.length * cellH + 100);
  const chosen = Math.min(state.direction, D.hooks.length - 1);
  const track = D.values[chosen];
  const peak = typical(track);
  const accuracy = D.accuracy[chosen] == null ? "" : `, probe accuracy ${D.accuracy[chosen].toFixed(3)}`;
  page.append(svg("text", { x: left, y: 10 }, `${D.hooks[chosen]}${accuracy}`));
  barTrack(page, "directions-track", D.tokens, track, left, cellW, bars, peak);
  page.append(svg("rect", {
    x: 0, y: gridTop + chosen * cellH, width: left - 2, height: cellH - 1, fill: "#dde8f6", "pointer-events": "none",
  }));
  const scales = D.values.map(typical);
  heatmap(page, left, gridTop, D.hooks, D.tokens, D.values, (v, r) => diverging(v / scales[r]), cellW, cellH, "directions-grid", true);
  const [first, second] = D.labels;
  $("directions-hint").textContent = `Each token's value at a hook point, projected on the direction from the ${first} texts' mean to the ${second} texts' (${D.file}), measured from the mean of both: red leans ${second}, blue ${first}. The track above is the chosen hook's; below, every hook (click one to choose it). Each row's scale is its 90th percentile of |value|, so that one outsized token (a causal model's first) does not wash out the rest: bars beyond it are outlined. Hover for the values.`;
  $("note").textContent = `directions: ${D.hooks.length} hook points × ${T} tokens`;
}

// ---- experts ----------------------------------------------------------------------------

function drawExperts() {
  const X = data.experts;
  const page = $("experts-svg");
  const T = X.tokens.length;
  const cellW = 46;
  const cellH = 16;
  const left = 90;
  const routed = X.layers.indexOf(state.layer);
  if (routed < 0) {
    sizePage(page, 400, 40);
    $("note").textContent = `layer ${state.layer + 1} has a dense MLP: no experts to show (routed layers: ${X.layers.map((l) => l + 1).join(", ")})`;
    return;
  }
  const weights = X.weights[routed]; // (T, E)
  const rows = Array.from({ length: X.experts }, (_, e) => `expert ${e}`);
  const values = rows.map((_, e) => weights.map((row) => row[e])); // (E, T)
  sizePage(page, left + T * cellW + 20, rows.length * cellH + 110);
  heatmap(page, left, 10, rows, X.tokens, values,
    (v) => (v > 0 ? `rgba(118,42,131,${0.15 + 0.85 * v})` : "#ffffff"), cellW, cellH, "experts-grid", true);
  $("note").textContent = `experts: layer ${state.layer + 1}, ${X.k} of ${X.experts} experts for each token (router weights${X.normalize ? ", renormalised to sum to 1" : ""})`;
}
