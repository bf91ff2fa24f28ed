// glassformer's explorable forward pass: the model as a flow of places (the embeddings, each
// block, the output), a place's sub-layers, a sub-layer's steps, one step's real tensor with
// its formula and source line, one query and key of a head's scores; and the output's
// distribution under temperature, top-k and top-p. Model text only ever goes in as text.
"use strict";

const data = JSON.parse(document.getElementById("explain-data").textContent);
data.steps.forEach((s, i) => { s.index = i; });
const state = { path: [], step: null, slice: 0, query: 0, key: 0, position: -1 };

// ---- levels: the model, a place, a sub-layer, a step --------------------------------------

const place = (where) => where.split(" · ")[0];

function children(path) {
  const steps = data.steps;
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

function drawLevel() {
  const flow = $("flow");
  const boxes = $("boxes");
  boxes.replaceChildren();
  flow.replaceChildren();
  $("flow-box").hidden = true;
  $("image-box").hidden = !(data.image && !data.live && state.path.length === 0 && state.step === null);
  if (state.step !== null) return;
  const kids = children(state.path);
  if (kids.length && kids[0].go !== undefined) {
    $("flow-box").hidden = false;
    (state.path.length === 0 ? drawModelFlow : drawBlockFlow)(flow, kids);
  } else {
    for (const child of kids) {
      const b = tag("button", child.label, "box");
      b.dataset.step = String(child.step);
      b.append(tag("small", child.name));
      boxes.append(b);
    }
  }
  const hints = ["The forward pass, top to bottom: the residual stream and the places on it. Click one to go inside.",
    "Its parts, in the order they run: each reads the stream and is added back to it. Click one.",
    "Its steps, in the order they run. Click one to see its numbers."];
  $("level-hint").textContent = hints[kids.length && kids[0].go !== undefined ? state.path.length : 2];
}

// A ViT's input, as the model sees it, with its grid of patches: the input's tokens.
function drawImage() {
  if (!data.image) return;
  const { png, rows, cols } = data.image;
  const page = $("image-svg");
  const side = 12 * Math.max(rows, cols, 16);
  sizePage(page, side, side);
  page.append(svg("image", { href: png, x: 0, y: 0, width: side, height: side, preserveAspectRatio: "none" }));
  const labels = data.labels.input.filter((l) => l !== "[class]");
  for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) {
    const cell = svg("rect", { x: (c * side) / cols, y: (r * side) / rows, width: side / cols, height: side / rows,
      fill: "none", stroke: "#e8a33d", "stroke-width": 1, class: "patch" });
    cell.append(svg("title", {}, `patch ${labels[r * cols + c]}`));
    page.append(cell);
  }
}

// ---- one step ------------------------------------------------------------------------------

function stepMatrix(s) {
  // the shown values as rows × columns, for the chosen slice of a 3-d (or more) tensor
  const v = stepValues(s.index);
  const shape = s.shown;
  const rowLabels = data.labels[s.rows];
  if (shape.length <= 1) return { rows: 1, cols: shape[0] || 1, at: (r, c) => v[c], rowLabels: [] };
  const cols = shape[shape.length - 1];
  const rows = shape[shape.length - 2];
  const offset = state.slice * rows * cols;
  const map = /hook_(attn_scores|pattern)$/.test(s.name);
  return { rows, cols, at: (r, c) => v[offset + r * cols + c], rowLabels, colLabels: map ? data.labels[s.cols] : null };
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
  fillSelect(select, Array.from({ length: slices }, (_, i) => String(i)), state.slice);
  drawMatrix(stepMatrix(s));
  drawLines(s);
  drawArithmetic(s);
}

function drawMatrix(m) {
  // rows by their tokens (a translator's: the source's or the target's); an attention map's
  // columns by its keys' tokens, written above it
  const page = $("step-svg");
  const cell = Math.max(4, Math.min(22, Math.floor(900 / m.cols)));
  const rowNames = m.rowLabels || [];
  const colNames = m.colLabels && m.colLabels.length === m.cols ? m.colLabels : null;
  const top = colNames ? 56 : 5;
  sizePage(page, 50 + m.cols * cell, top + 5 + m.rows * cell, 10);
  let peak = 1e-12;
  for (let r = 0; r < m.rows; r++) for (let c = 0; c < m.cols; c++) {
    const x = m.at(r, c);
    if (x > MASKED / 2) peak = Math.max(peak, Math.abs(x));
  }
  const label = (r) => (m.rows === rowNames.length ? rowNames[r] : String(r));
  const group = svg("g", { id: "step-cells" });
  if (colNames) {
    colNames.forEach((name, c) => {
      const x = 50 + c * cell + cell * 0.7;
      group.append(svg("text", { x, y: top - 4, transform: `rotate(-60 ${x} ${top - 4})` }, name.slice(0, 8)));
    });
  }
  for (let r = 0; r < m.rows; r++) {
    group.append(svg("text", { x: 46, y: top + r * cell + cell * 0.7, "text-anchor": "end" }, label(r).slice(0, 8)));
    for (let c = 0; c < m.cols; c++) {
      const x = m.at(r, c);
      const masked = x <= MASKED / 2;
      const t = masked ? 0 : x / peak;
      const colour = masked ? "#ddd" : t >= 0 ? `rgba(178,24,43,${t})` : `rgba(33,102,172,${-t})`;
      const rect = svg("rect", { x: 50 + c * cell, y: top + r * cell, width: cell - 1, height: cell - 1,
        fill: colour, "data-row": r, "data-col": c, "data-value": masked ? "-inf" : x });
      const where = colNames ? `${label(r)} → ${colNames[c]}` : `${label(r)}, feature ${c}`;
      rect.append(svg("title", {}, `[${r}, ${c}] ${where}: ${masked ? "masked" : x}`));
      group.append(rect);
    }
  }
  page.append(group);
}

// An attention map's weights as the familiar lines: the queries' tokens on the left, the
// keys' on the right, a line between them as opaque as the weight (the chosen head).
function drawLines(s) {
  const box = $("lines-box");
  box.hidden = !/hook_pattern$/.test(s.name);
  if (box.hidden) return;
  const [, Tq, Tk] = s.shown.length === 3 ? s.shown : [1, ...s.shown];
  const v = stepValues(s.index);
  const offset = state.slice * Tq * Tk;
  const rows = data.labels[s.rows] || [];
  const cols = data.labels[s.cols] || [];
  const gap = 18;
  const page = $("lines-svg");
  sizePage(page, 420, 20 + Math.max(Tq, Tk) * gap);
  const group = svg("g", { id: "attention-lines" });
  for (let q = 0; q < Tq; q++) for (let k = 0; k < Tk; k++) {
    const w = v[offset + q * Tk + k];
    if (!(w > 0.001)) continue;
    group.append(svg("line", { x1: 130, y1: 14 + q * gap, x2: 290, y2: 14 + k * gap, stroke: "#b2182b",
      "stroke-opacity": w, "stroke-width": 2, "data-q": q, "data-k": k, "data-weight": w }));
  }
  for (let q = 0; q < Tq; q++) group.append(svg("text", { x: 124, y: 18 + q * gap, "text-anchor": "end" }, (rows[q] ?? String(q)).slice(0, 16)));
  for (let k = 0; k < Tk; k++) group.append(svg("text", { x: 296, y: 18 + k * gap }, (cols[k] ?? String(k)).slice(0, 16)));
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
  for (const [which, n] of [["query", T], ["key", Tk]]) {
    state[which] = Math.min(state[which], n - 1); // a place another step had may not exist here
    const names = data.labels[which === "query" ? q.rows : k.rows] || [];
    const labels = Array.from({ length: n }, (_, i) => `${i}: ${names[i] ?? i}`);
    fillSelect($(which), labels, state[which]);
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
  const cell = document.querySelector(`#step-cells rect[data-row="${state.query}"][data-col="${state.key}"]`);
  if (cell) cell.classList.add("chosen");
  const sumLine = $("arith-sum");
  sumLine.textContent = `head ${h}: Σ_d q_d·k_d × ${s.scale.toFixed(4)} = ${sum.toFixed(6)}`;
  sumLine.dataset.sum = String(sum);
  const weight = s.name.endsWith("hook_pattern") ? stepValues(s.index)[(h * T + state.query) * Tk + state.key] : null;
  $("arith-rest").textContent = scoreRest(s, h, T, sum) + (weight === null ? "" : `; after the softmax over the keys, its weight: ${weight.toFixed(6)}`);
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

// What the score holds beside the products: nothing (the products are the score), the
// mask, or what the model adds to q·k (a position bias, a cap), read from the scores step.
function scoreRest(s, h, T, sum) {
  const base = s.name.slice(0, s.name.lastIndexOf(".") + 1);
  const scores = data.steps.find((t) => t.name === base + "hook_attn_scores");
  delete $("arith-rest").dataset.score;
  if (!scores) return "";
  const [, Tq, Tk] = scores.shown;
  const score = stepValues(scores.index)[(h * Tq + state.query) * Tk + state.key];
  $("arith-rest").dataset.score = String(score);
  if (score <= MASKED / 2) return "the score: masked (−∞ before the softmax), whatever the products";
  const rest = score - sum;
  if (Math.abs(rest) <= 1e-4 * Math.max(1, Math.abs(score))) return `the score: ${score.toFixed(6)}, the products' sum`;
  return `the score: ${score.toFixed(6)}; the products' sum and ${rest.toFixed(6)} the model adds (${scores.what})`;
}

// ---- the output ----------------------------------------------------------------------------

// The distribution the output panel shows: a classifier's classes, or the next token after
// one position (a language model's last; a translator's chosen target position).
function chosen() {
  const out = data.output;
  if (out.kind === "classes") return { logits: out.logits, labels: out.labels, top: null, ids: null };
  return out.positions[state.position < 0 ? out.positions.length - 1 : state.position];
}

function distribution(at) {
  // softmax(logits / T) over every logit carried, then top-k and top-p, renormalised; each
  // as [token or class index, probability]
  const logits = values(at.logits);
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
  return order.map((i) => [at.ids ? at.ids[i] : i, keep.has(i) ? probs[i] / total : 0]);
}

function drawOutput() {
  const out = data.output;
  $("output").hidden = !out;
  if (!out) return;
  $("temperature-value").textContent = Number($("temperature").value).toFixed(2);
  $("top-p-value").textContent = Number($("top-p").value).toFixed(2);
  const at = chosen();
  const target = data.labels.target || [];
  $("position-label").hidden = out.kind !== "translation";
  if (out.kind === "translation") {
    const t = at.after;
    const next = target[t + 1];
    $("output-what").textContent = `after "${target.slice(0, t + 1).join(" ")}", the next token`
      + (next === undefined ? " (the translation ends here)" : `: the translation has "${next}"`);
  } else {
    $("output-what").textContent = out.kind === "classes" ? "the classes" : "the next token";
  }
  $("output-kept").textContent = at.ids ? `over the ${at.ids.length.toLocaleString()} likeliest of ${out.vocab.toLocaleString()} tokens` : "";
  const list = $("distribution");
  list.replaceChildren();
  const labelOf = (i) => (out.kind === "classes" ? at.labels[i] : at.labels[at.top.indexOf(i)] ?? `token ${i}`);
  for (const [i, prob] of distribution(at).slice(0, 10)) {
    const item = tag("li", `${labelOf(i)}  ${prob.toFixed(4)}`);
    item.dataset.index = String(i);
    item.dataset.prob = String(prob);
    const bar = tag("span", undefined, "bar"); // the probability drawn: 12em is certainty
    bar.style.width = `${(12 * prob).toFixed(2)}em`;
    item.append(bar);
    list.append(item);
  }
}

// ---- controls ------------------------------------------------------------------------------

let shownLevel = "";

function draw() {
  drawCrumbs();
  drawLevel();
  drawStep();
  const level = JSON.stringify([state.path, state.step]);
  if (level !== shownLevel) { // a move between levels slides the new one in (typing does not)
    const main = document.querySelector("#layout main");
    main.classList.remove("enter");
    void main.offsetWidth; // (the class comes back on a fresh frame, so the animation runs again)
    main.classList.add("enter");
    shownLevel = level;
  }
  if (data.live) {
    $("note").textContent = `${data.steps.length} steps, every one computed in this page from the model's weights (${liveWeightsSaid()}) on the ${data.live.image ? "image" : "text"} above: ${data.live.decode ? `${live.inputs.source.length} source tokens, decoded into ${data.tokens.length} target positions` : `${data.tokens.length} ${data.live.image ? "tokens (the class token and the patches)" : "tokens"}`} in ${live.ms.toFixed(1)} ms`;
    return;
  }
  const derived = data.steps.filter((s) => s.derive).length;
  const precision = data.precision === "f16" ? "; values carried as float16 to keep the page small (about 3 significant digits)" : "";
  $("note").textContent = `${data.steps.length} steps, every number the model's: ${data.steps.length - derived} read at its hook points and carried, ${derived} computed here from them as the model did${precision}`;
}

// A ViT's live page: a pad to draw on, read as the model's image (each pixel the mean of
// its square of the pad), run through the model as it is drawn.
function startPad() {
  const { channels, size: [H, W], pixels } = data.live.image;
  const pad = $("pad");
  const ctx = pad.getContext("2d", { willReadFrequently: true });
  const [sx, sy] = [pad.width / W, pad.height / H];
  $("live-typed").hidden = true;
  $("pad-box").hidden = false;
  for (let y = 0; y < H; y++) for (let x = 0; x < W; x++) { // the page's own image, to start
    const grey = Math.round(255 * pixels[y * W + x]);
    ctx.fillStyle = `rgb(${grey},${grey},${grey})`;
    ctx.fillRect(x * sx, y * sy, sx, sy);
  }
  const read = () => {
    const rgba = ctx.getImageData(0, 0, pad.width, pad.height).data;
    const out = new Float64Array(channels * H * W);
    for (let y = 0; y < H; y++) for (let x = 0; x < W; x++) {
      const sums = [0, 0, 0];
      for (let i = Math.round(y * sy); i < Math.round((y + 1) * sy); i++) for (let j = Math.round(x * sx); j < Math.round((x + 1) * sx); j++) {
        for (let c = 0; c < 3; c++) sums[c] += rgba[(i * pad.width + j) * 4 + c];
      }
      const n = (Math.round((y + 1) * sy) - Math.round(y * sy)) * (Math.round((x + 1) * sx) - Math.round(x * sx));
      const means = sums.map((v) => v / n / 255);
      for (let c = 0; c < channels; c++) out[(c * H + y) * W + x] = channels === 1 ? (means[0] + means[1] + means[2]) / 3 : means[c];
    }
    return out;
  };
  let drawing = false;
  let last = null;
  const rerun = () => {
    const start = performance.now();
    runLive(read());
    draw();
    drawOutput();
    window.liveRedrawMs = performance.now() - start;
    $("live-note").textContent = `run and redrawn in ${window.liveRedrawMs.toFixed(0)} ms`;
  };
  pad.addEventListener("pointerdown", (e) => { drawing = true; last = [e.offsetX, e.offsetY]; });
  pad.addEventListener("pointermove", (e) => {
    if (!drawing) return;
    ctx.strokeStyle = "#fff";
    ctx.lineWidth = 1.5 * Math.min(sx, sy);
    ctx.lineCap = "round";
    ctx.beginPath();
    ctx.moveTo(...last);
    ctx.lineTo(e.offsetX, e.offsetY);
    ctx.stroke();
    last = [e.offsetX, e.offsetY];
  });
  pad.addEventListener("pointerup", () => { drawing = false; rerun(); });
  $("pad-clear").addEventListener("click", () => { ctx.fillStyle = "#000"; ctx.fillRect(0, 0, pad.width, pad.height); rerun(); });
  runLive(Float64Array.from(pixels));
}

// A translator's translation, as its tokens read (spaces for ␣), after the note's figures.
function liveTranslation() {
  if (!data.live.decode) return "";
  return `; its translation, decoded here token by token: ${data.labels.target.slice(1).join("").replaceAll("␣", " ").replaceAll("⏎", " ").trim()}`;
}

// The live page: the typed text runs through the model here, and every level redraws.
async function startLive() {
  $("live").hidden = false;
  await liveUnpack();
  if (data.live.image) { startPad(); return; }
  const input = $("live-text");
  input.value = data.text;
  runLive(liveTokenize(data.text));
  $("live-note").textContent = liveTranslation().replace(/^; i/, "I");
  input.addEventListener("input", () => {
    const ids = liveTokenize(input.value);
    if (!ids.length) { $("live-note").textContent = "(no tokens: type some text)"; return; }
    const start = performance.now();
    runLive(ids);
    data.text = input.value;
    $("subtitle").textContent = input.value;
    if (data.output && data.output.kind === "translation") fillPositions();
    draw();
    drawOutput();
    window.liveRedrawMs = performance.now() - start;
    $("live-note").textContent = `${ids.length} tokens, run and redrawn in ${window.liveRedrawMs.toFixed(0)} ms${liveTranslation()}`;
  });
}

// A translator's output: the next token after each target position, from the first.
function fillPositions() {
  const target = data.labels.target || [];
  const positions = data.output.positions;
  fillSelect($("position"), positions.map((p) => `${p.after + 1}: after "${target[p.after] ?? ""}"`), 0);
  state.position = 0;
}

async function start() {
  if (data.live) await startLive();
  document.title = data.title;
  $("title").textContent = data.title;
  $("subtitle").textContent = data.text;
  $("boxes").addEventListener("click", (e) => {
    const b = e.target.closest("button.box");
    if (!b) return;
    state.step = Number(b.dataset.step);
    draw();
  });
  const descend = (e) => {
    const node = e.target.closest("[data-go]");
    if (!node || (e.type === "keydown" && e.key !== "Enter" && e.key !== " ")) return;
    state.path.push(node.dataset.go);
    draw();
  };
  $("flow").addEventListener("click", descend);
  $("flow").addEventListener("keydown", descend);
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
  if (data.output && data.output.kind === "translation") {
    fillPositions();
    $("position").addEventListener("change", (e) => { state.position = Number(e.target.value); drawOutput(); });
  }
  drawImage();
  draw();
  drawOutput();
  startTour();
  window.openMs = performance.now(); // from the page's navigation to ready: its open time
  document.body.dataset.ready = "1";
}

start();
