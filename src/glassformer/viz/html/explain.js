// glassformer's explorable forward pass: the model as a flow of places (the embeddings, each
// block, the output), a place's sub-layers, a sub-layer's steps, one step's real tensor with
// its formula and source line, one query and key of a head's scores; and the output's
// distribution under temperature, top-k and top-p. Model text only ever goes in as text.
"use strict";

const data = JSON.parse(document.getElementById("explain-data").textContent);
data.steps.forEach((s, i) => { s.index = i; });
const state = { path: [], step: null, slice: 0, query: 0, key: 0 };
const decoded = new Map(); // base64 → values, decoded once
const computed = new Map(); // a step's index → its values, found once

function values(base64, dtype = "f32") {
  if (!decoded.has(base64)) decoded.set(base64, dtype === "f16" ? halves(base64) : floats(base64));
  return decoded.get(base64);
}

// A tensor sent as base64 of little-endian float16 values (a page that would be too large
// as float32 carries its steps so, and says so).
function halves(base64) {
  const bytes = atob(base64);
  const out = new Float32Array(bytes.length / 2);
  for (let i = 0; i < out.length; i++) {
    const h = bytes.charCodeAt(2 * i) | (bytes.charCodeAt(2 * i + 1) << 8);
    const exponent = (h >> 10) & 31;
    const fraction = h & 1023;
    const size = exponent === 0 ? fraction * 2 ** -24
      : exponent === 31 ? (fraction ? NaN : Infinity) : (1 + fraction / 1024) * 2 ** (exponent - 15);
    out[i] = h & 0x8000 ? -size : size;
  }
  return out;
}

// ---- the steps the page computes from earlier ones (glassformer/viz/derive.py) --------------
// A step carries its values or the rule that computes them, the line the model itself ran:
// written twice, in derive.py's torch (which checks, when the page is made, that the rule
// gives the model's value) and here.

function stepValues(i) {
  if (!computed.has(i)) {
    const s = data.steps[i];
    computed.set(i, s.derive ? derive(s.derive, s.shown) : values(s.values, s.dtype));
  }
  return computed.get(i);
}

const MASKED = -1e30;
const last = (shape) => shape[shape.length - 1];
const size = (shape) => shape.reduce((a, b) => a * b, 1);

function erf(x) { // Abramowitz and Stegun 7.1.26: within 1.5e-7
  const t = 1 / (1 + 0.3275911 * Math.abs(x));
  const y = 1 - t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))) * Math.exp(-x * x);
  return x >= 0 ? y : -y;
}

const FUNCTIONS = {
  relu: (x) => Math.max(x, 0),
  gelu: (x) => 0.5 * x * (1 + erf(x / Math.SQRT2)),
  gelu_tanh: (x) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3))),
  silu: (x) => x / (1 + Math.exp(-x)),
};

function derive(rule, shape) {
  const parts = rule.of.map(stepValues);
  const shapes = rule.of.map((j) => data.steps[j].shown);
  const out = new Float64Array(size(shape));
  const [a, b] = parts;
  if (rule.op === "same") return a;
  if (rule.op === "sum") out.forEach((_, i) => { out[i] = a[i] + b[i]; });
  if (rule.op === "act") out.forEach((_, i) => { out[i] = FUNCTIONS[rule.fn](a[i]) * (b ? b[i] : 1); });
  if (rule.op === "softmax") {
    const n = last(shape);
    for (let r = 0; r < out.length / n; r++) {
      let peak = -Infinity;
      for (let c = 0; c < n; c++) peak = Math.max(peak, a[r * n + c]);
      let total = 0;
      for (let c = 0; c < n; c++) total += (out[r * n + c] = Math.exp(a[r * n + c] - peak));
      for (let c = 0; c < n; c++) out[r * n + c] /= total;
    }
  }
  if (rule.op === "weighted" || rule.op === "scores") {
    // weighted: weights (H, Tq, Tk) · values (Hkv, Tk, Dv); scores: q (H, Tq, D) · k (Hkv, Tk, D) / √D
    const [H, Tq, inner] = shapes[0];
    const [Hkv, Tk, Dk] = shapes[1];
    const n = last(shape);
    const scores = rule.op === "scores";
    for (let h = 0; h < H; h++) {
      const g = Math.floor(h / (H / Hkv));
      for (let t = 0; t < Tq; t++) for (let c = 0; c < n; c++) {
        let sum = 0;
        for (let j = 0; j < inner; j++) {
          sum += a[(h * Tq + t) * inner + j] * (scores ? b[(g * Tk + c) * Dk + j] : b[(g * Tk + j) * Dk + c]);
        }
        const masked = scores && rule.mask === "causal" && c > t + (Tk - Tq);
        out[(h * Tq + t) * n + c] = masked ? MASKED : scores ? sum / Math.sqrt(inner) : sum;
      }
    }
  }
  if (rule.op === "rope") { // the first `width` features of each (head, position) turned
    const table = data.tables[rule.table];
    const [cos, sin] = [values(table.cos), values(table.sin)];
    const width = table.shape[1];
    const D = last(shape);
    const half = width / 2;
    for (let i = 0; i < out.length; i++) {
      const d = i % D;
      const t = Math.floor(i / D) % shape[shape.length - 2];
      if (d >= width) { out[i] = a[i]; continue; }
      const turned = d < half ? -a[i + half] : a[i - half];
      out[i] = a[i] * cos[t * width + d] + turned * sin[t * width + d];
    }
  }
  if (rule.op === "norm") { // (x − shift)·scale per row, · weight + bias per feature
    const [scale, weight] = [values(rule.scale), values(rule.weight)];
    const shift = rule.shift ? values(rule.shift) : null; // an RMSNorm's are zeros, left out
    const bias = rule.bias ? values(rule.bias) : null;
    const n = last(shape);
    out.forEach((_, i) => {
      const r = Math.floor(i / n);
      const c = i % n;
      out[i] = (a[i] - (shift ? shift[r] : 0)) * scale[r] * weight[c] + (bias ? bias[c] : 0);
    });
  }
  return out;
}

const RULES = {
  same: (s) => `the same as ${s}`, sum: (s, t) => `${s} + ${t}`, softmax: (s) => `softmax of ${s}`,
  weighted: (s, t) => `${s} · ${t}`, scores: (s, t) => `${s} · ${t}ᵀ / √d`, rope: (s) => `${s} turned by position`,
  norm: (s) => `${s} normalised (each row's statistics carried)`, act: (s, t) => (t ? `act(${s}) · ${t}` : `act(${s})`),
};

function howFound(s) {
  if (!s.derive) return s.dtype === "f16" ? "carried in the page, as float16 (about 3 significant digits)" : "carried in the page";
  const names = s.derive.of.map((j) => data.steps[j].name);
  const rule = RULES[s.derive.op](...names).replace("act(", `${s.derive.fn}(`);
  return `computed in the page, as the model did: ${rule}`;
}

// ---- levels: the model, a place, a sub-layer, a step --------------------------------------

const place = (where) => where.split(" · ")[0];

function children(path) {
  const steps = data.steps.map((s, i) => ({ ...s, index: i }));
  if (path.length === 0) {
    return [...new Set(steps.map((s) => place(s.where)))].map((p) => ({ label: p, go: p,
      count: steps.filter((s) => place(s.where) === p).length }));
  }
  if (path.length === 1) {
    const inside = steps.filter((s) => place(s.where) === path[0]);
    const groups = [...new Set(inside.map((s) => s.where))];
    if (groups.length === 1) return inside.map((s) => ({ label: s.what, step: s.index, name: s.name }));
    return groups.map((g) => ({ label: g === path[0] ? `${g}: its input` : g.split(" · ")[1], go: g,
      count: inside.filter((s) => s.where === g).length }));
  }
  return steps.filter((s) => s.where === path[1]).map((s) => ({ label: s.what, step: s.index, name: s.name }));
}

function drawCrumbs() {
  const nav = $("crumbs");
  nav.replaceChildren();
  const levels = ["the model", ...state.path, ...(state.step === null ? [] : [data.steps[state.step].name])];
  levels.forEach((label, depth) => {
    if (depth) nav.append(tag("span", " › ", "sep"));
    const b = tag("button", label);
    b.dataset.depth = String(depth);
    nav.append(b);
  });
}

function drawBoxes() {
  const boxes = $("boxes");
  boxes.replaceChildren();
  if (state.step !== null) return;
  for (const child of children(state.path)) {
    const b = tag("button", child.label, "box");
    if (child.go !== undefined) {
      b.dataset.go = child.go;
      b.append(tag("small", `${child.count} steps`));
    } else {
      b.dataset.step = String(child.step);
      b.append(tag("small", child.name));
    }
    boxes.append(b);
  }
  const hints = ["The forward pass, top to bottom. Click a place to go inside.",
    "Its parts, in the order they run. Click one.", "Its steps, in the order they run. Click one to see its numbers."];
  $("level-hint").textContent = hints[Math.min(state.path.length, 2)];
}

// ---- one step ------------------------------------------------------------------------------

function stepMatrix(s) {
  // the shown values as rows × columns, for the chosen slice of a 3-d (or more) tensor
  const v = stepValues(s.index);
  const shape = s.shown;
  if (shape.length <= 1) return { rows: 1, cols: shape[0] || 1, at: (r, c) => v[c] };
  const cols = shape[shape.length - 1];
  const rows = shape[shape.length - 2];
  const offset = state.slice * rows * cols;
  return { rows, cols, at: (r, c) => v[offset + r * cols + c] };
}

function drawStep() {
  const section = $("step");
  section.hidden = state.step === null;
  if (state.step === null) return;
  const s = data.steps[state.step];
  $("step-name").textContent = s.name;
  $("step-what").textContent = s.what;
  const thinned = s.shown.join() !== s.shape.join() ? ` (showing ${s.shown.join(" × ")})` : "";
  const layout = s.layout ? `, shown as ${s.layout}` : "";
  $("step-shape").textContent = `shape ${s.shape.join(" × ")}${layout}${thinned}`;
  $("step-how").textContent = howFound(s);
  $("step-file").textContent = s.source.file ? `${s.source.file}:${s.source.line}` : "(no source line)";
  $("step-code").textContent = s.source.code;
  const slices = s.shown.length >= 3 ? s.shown.slice(0, -2).reduce((a, b) => a * b, 1) : 1;
  $("slice-label").hidden = slices === 1;
  const select = $("slice");
  state.slice = Math.min(state.slice, slices - 1);
  fillSelect(select, Array.from({ length: slices }, (_, i) => String(i + 1)), state.slice);
  drawMatrix(stepMatrix(s));
  drawArithmetic(s);
}

function drawMatrix(m) {
  const page = $("step-svg");
  const cell = Math.max(4, Math.min(22, Math.floor(900 / m.cols)));
  const width = 50 + m.cols * cell;
  const height = 10 + m.rows * cell;
  sizePage(page, width, height, 10);
  let peak = 1e-12;
  for (let r = 0; r < m.rows; r++) for (let c = 0; c < m.cols; c++) {
    const x = m.at(r, c);
    if (x > -1e29) peak = Math.max(peak, Math.abs(x));
  }
  const label = (r) => (m.rows === data.tokens.length ? data.tokens[r] : String(r + 1));
  const group = svg("g", { id: "step-cells" });
  for (let r = 0; r < m.rows; r++) {
    group.append(svg("text", { x: 46, y: 5 + r * cell + cell * 0.7, "text-anchor": "end" }, label(r).slice(0, 8)));
    for (let c = 0; c < m.cols; c++) {
      const x = m.at(r, c);
      const masked = x <= -1e29;
      const t = masked ? 0 : x / peak;
      const colour = masked ? "#ddd" : t >= 0 ? `rgba(178,24,43,${t})` : `rgba(33,102,172,${-t})`;
      const rect = svg("rect", { x: 50 + c * cell, y: 5 + r * cell, width: cell - 1, height: cell - 1,
        fill: colour, "data-row": r, "data-col": c, "data-value": masked ? "-inf" : x });
      rect.append(svg("title", {}, `[${r}, ${c}] ${masked ? "masked" : x}`));
      group.append(rect);
    }
  }
  page.append(group);
}

// ---- one query and one key: the products that make a score --------------------------------

function sibling(s, leaf) {
  const base = s.name.slice(0, s.name.lastIndexOf(".") + 1);
  return data.steps.find((t) => t.name === base + `hook_rot_${leaf}`) || data.steps.find((t) => t.name === base + `hook_${leaf}`);
}

function drawArithmetic(s) {
  const box = $("arith");
  const q = sibling(s, "q");
  const k = sibling(s, "k");
  const scores = s.name.endsWith("hook_attn_scores") || s.name.endsWith("hook_pattern");
  box.hidden = !(scores && q && k && s.scale !== undefined);
  if (box.hidden) return;
  const [H, T, D] = q.shown; // heads × positions × features
  const [Hkv, Tk] = k.shown;
  for (const [id, n, which] of [["query", T, "query"], ["key", Tk, "key"]]) {
    const labels = Array.from({ length: n }, (_, i) => `${i}: ${data.tokens[i] ?? i}`);
    fillSelect($(id), labels, Math.min(state[which], n - 1));
  }
  const h = state.slice;
  const g = Math.floor(h / (H / Hkv));
  const qv = stepValues(q.index);
  const kv = stepValues(k.index);
  const products = [];
  for (let d = 0; d < D; d++) {
    products.push(qv[(h * T + state.query) * D + d] * kv[(g * Tk + state.key) * D + d] * s.scale);
  }
  const sum = products.reduce((a, b) => a + b, 0);
  const sumLine = $("arith-sum");
  sumLine.textContent = `head ${h + 1}: Σ_d q_d·k_d × ${s.scale.toFixed(4)} = ${sum.toFixed(6)}`;
  sumLine.dataset.sum = String(sum);
  const page = $("arith-svg");
  page.replaceChildren();
  const peak = Math.max(1e-12, ...products.map(Math.abs));
  const width = 20 + D * 8;
  page.setAttribute("width", String(width));
  page.setAttribute("height", "110");
  products.forEach((p, d) => {
    const height = (Math.abs(p) / peak) * 48;
    const bar = svg("rect", { x: 10 + d * 8, y: p >= 0 ? 55 - height : 55, width: 6, height: Math.max(height, 0.5),
      fill: p >= 0 ? "#b2182b" : "#2166ac", class: "product", "data-value": p });
    bar.append(svg("title", {}, `d=${d}: ${p}`));
    page.append(bar);
  });
}

// ---- the output ----------------------------------------------------------------------------

function distribution() {
  // softmax(logits / T) over every logit, then top-k and top-p, renormalised
  const out = data.output;
  const logits = values(out.logits);
  const T = Number($("temperature").value);
  const k = Number($("top-k").value);
  const p = Number($("top-p").value);
  let peak = -Infinity;
  for (const x of logits) peak = Math.max(peak, x / T);
  const probs = Float64Array.from(logits, (x) => Math.exp(x / T - peak));
  let total = probs.reduce((a, b) => a + b, 0);
  probs.forEach((_, i) => { probs[i] /= total; });
  const order = [...probs.keys()].sort((a, b) => probs[b] - probs[a]);
  const keep = new Set();
  let mass = 0;
  for (const i of order) {
    if ((k > 0 && keep.size >= k) || (keep.size > 0 && mass >= p)) break;
    keep.add(i);
    mass += probs[i];
  }
  total = 0;
  for (const i of keep) total += probs[i];
  return order.map((i) => [i, keep.has(i) ? probs[i] / total : 0]);
}

function drawOutput() {
  const out = data.output;
  $("output").hidden = !out;
  if (!out) return;
  $("temperature-value").textContent = Number($("temperature").value).toFixed(2);
  $("top-p-value").textContent = Number($("top-p").value).toFixed(2);
  const list = $("distribution");
  list.replaceChildren();
  const labelOf = (i) => (out.kind === "classes" ? out.labels[i] : out.labels[out.top.indexOf(i)] ?? `token ${i}`);
  for (const [i, prob] of distribution().slice(0, 10)) {
    const item = tag("li", `${labelOf(i)}  ${prob.toFixed(4)}`);
    item.dataset.index = String(i);
    item.dataset.prob = String(prob);
    list.append(item);
  }
}

// ---- controls ------------------------------------------------------------------------------

function draw() {
  drawCrumbs();
  drawBoxes();
  drawStep();
  const derived = data.steps.filter((s) => s.derive).length;
  const precision = data.precision === "f16" ? "; values carried as float16 to keep the page small (about 3 significant digits)" : "";
  $("note").textContent = `${data.steps.length} steps, every number the model's: ${data.steps.length - derived} read at its hook points and carried, ${derived} computed here from them as the model did${precision}`;
}

function start() {
  document.title = data.title;
  $("title").textContent = data.title;
  $("subtitle").textContent = data.text;
  $("boxes").addEventListener("click", (e) => {
    const b = e.target.closest("button.box");
    if (!b) return;
    if (b.dataset.go !== undefined) state.path.push(b.dataset.go);
    else state.step = Number(b.dataset.step);
    draw();
  });
  $("crumbs").addEventListener("click", (e) => {
    const b = e.target.closest("button");
    if (!b) return;
    const depth = Number(b.dataset.depth);
    state.step = null;
    state.path = state.path.slice(0, depth);
    draw();
  });
  $("slice").addEventListener("change", (e) => { state.slice = Number(e.target.value); drawStep(); });
  $("query").addEventListener("change", (e) => { state.query = Number(e.target.value); drawStep(); });
  $("key").addEventListener("change", (e) => { state.key = Number(e.target.value); drawStep(); });
  for (const id of ["temperature", "top-k", "top-p"]) $(id).addEventListener("input", drawOutput);
  draw();
  drawOutput();
  document.body.dataset.ready = "1";
}

start();
