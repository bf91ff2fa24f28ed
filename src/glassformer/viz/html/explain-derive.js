// glassformer's explorable forward pass: each step's values, carried in the page or computed
// from earlier steps by the rule the page was given (glassformer/viz/derive.py). Loaded
// after helpers.js and before explain.js, whose `data` it reads when called.
"use strict";

const decoded = new Map(); // base64 → values, decoded once
const computed = new Map(); // a step's index → its values, found once

function values(base64, dtype = "f32") {
  if (typeof base64 !== "string") return base64; // the live page's: computed, not carried
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
  if (data.live) return liveValues(i); // the live page computes every step (live-forward.js)
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

// the rules this page knows (derive.py's tests check that they are the ones it gives)
const OPS = ["same", "sum", "act", "softmax", "weighted", "scores", "rope", "norm"];

function derive(rule, shape) {
  const parts = rule.of.map(stepValues);
  const shapes = rule.of.map((j) => data.steps[j].shown);
  const out = new Float64Array(size(shape));
  const [a, b] = parts;
  if (!OPS.includes(rule.op)) throw new Error(`no rule ${rule.op}`); // never zeros as values
  if (rule.op === "same") return a;
  if (rule.op === "sum") out.forEach((_, i) => { out[i] = a[i] + b[i]; });
  if (rule.op === "act") out.forEach((_, i) => { out[i] = FUNCTIONS[rule.fn](a[i]) * (b ? b[i] : 1); });
  if (rule.op === "softmax") {
    const n = last(shape);
    for (let r = 0; r < out.length / n; r++) {
      let peak = -Infinity;
      for (let c = 0; c < n; c++) peak = Math.max(peak, a[r * n + c]);
      if (peak <= MASKED / 2) continue; // a row that may read no key: zeros, as the model gives
      let total = 0;
      for (let c = 0; c < n; c++) total += (out[r * n + c] = Math.exp(a[r * n + c] - peak));
      for (let c = 0; c < n; c++) out[r * n + c] /= total;
    }
  }
  if (rule.op === "scores") return scoresOf(rule, a, shapes[0], b, shapes[1], null);
  if (rule.op === "weighted") { // weights (H, Tq, Tk) · values (Hkv, Tk, Dv)
    const [H, Tq, inner] = shapes[0];
    const [Hkv, Tk, Dk] = shapes[1];
    const n = last(shape);
    for (let h = 0; h < H; h++) {
      const g = Math.floor(h / (H / Hkv));
      for (let t = 0; t < Tq; t++) for (let c = 0; c < n; c++) {
        let sum = 0;
        for (let j = 0; j < inner; j++) sum += a[(h * Tq + t) * inner + j] * b[(g * Tk + j) * Dk + c];
        out[(h * Tq + t) * n + c] = sum;
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
      const turned = table.interleaved ? (d % 2 === 0 ? -a[i + 1] : a[i - 1]) // GPT-J's pairs
        : d < half ? -a[i + half] : a[i - half];
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

// q (H, Tq, D) · k (Hkv, Tk, D)ᵀ × scale (1/√D unless the rule says), squashed to c·tanh(s/c)
// under a soft cap; a later key (causal), one outside the window or a padded one (its id in
// ``keys`` the rule's pad: a live page's) masked. The one scores rule of both pages
// (derive.py's ``scores``).
function scoresOf(rule, q, qShape, k, kShape, keys) {
  const [H, Tq, D] = qShape;
  const [Hkv, Tk] = kShape;
  const scale = rule.scale ?? 1 / Math.sqrt(D);
  const out = new Float64Array(H * Tq * Tk);
  const allowed = (t, c) => {
    const i = t + (Tk - Tq); // the query's position among the keys
    if (rule.mask === "causal" && c > i) return false;
    if (rule.pad != null && keys && keys[c] === rule.pad) return false;
    if (!rule.window) return true;
    const [left, right] = rule.window;
    let ok = c >= i - left && c <= i + right;
    if (rule.global) ok = (ok || c < rule.global || i < rule.global) && (right !== 0 || c <= i);
    return ok;
  };
  for (let h = 0; h < H; h++) {
    const g = Math.floor(h / (H / Hkv));
    for (let t = 0; t < Tq; t++) for (let c = 0; c < Tk; c++) {
      let sum = 0;
      for (let d = 0; d < D; d++) sum += q[(h * Tq + t) * D + d] * k[(g * Tk + c) * D + d];
      const score = rule.softcap ? rule.softcap * Math.tanh((sum * scale) / rule.softcap) : sum * scale;
      out[(h * Tq + t) * Tk + c] = allowed(t, c) ? score : MASKED;
    }
  }
  return out;
}

const LIVE_RULES = { // the live page's own rules (live-forward.js), in words
  embed: () => "the embedding table's rows for the tokens", rows: () => "the position table's rows",
  linear: (s) => `${s} · Wᵀ + b`, layernorm: (s) => `LayerNorm of ${s}`, rmsnorm: (s) => `RMSNorm of ${s}`,
  pool: (s) => `${s} pooled over the tokens`, scores: (s, t) => `${s} · ${t}ᵀ / √d, masked`,
};

const RULES = {
  same: (s) => `the same as ${s}`, sum: (s, t) => `${s} + ${t}`, softmax: (s) => `softmax of ${s}`,
  weighted: (s, t) => `${s} · ${t}`, scores: (s, t) => `${s} · ${t}ᵀ / √d`, rope: (s) => `${s} turned by position`,
  norm: (s) => `${s} normalised (each row's statistics carried)`, act: (s, t) => (t ? `act(${s}) · ${t}` : `act(${s})`),
};

function howFound(s) {
  if (s.live) {
    const bound = s.bound === undefined ? "" : ` (weights rounded to ${data.live.weights.bits} mantissa bits: within ${(100 * s.bound).toPrecision(2)}% of its largest value, four times the error measured when the page was written)`;
    const parts = (s.live.of || []).map((j) => data.steps[j].name);
    if (s.live.project) parts[0] = `(${parts[0]} · Wᵀ${s.live.project.bias ? " + b" : ""})`; // Gemma's norm after a sub-layer
    const capped = s.live.op === "linear" && s.live.softcap ? `, squashed to ${s.live.softcap}·tanh(s / ${s.live.softcap})` : "";
    const said = (LIVE_RULES[s.live.op] || RULES[s.live.op] || ((x) => s.live.op))(...parts).replace("act(", `${s.live.fn}(`) + capped;
    return `computed in this page from the model's weights: ${said}${bound}`;
  }
  const within = s.error === undefined ? "" : ` (within ${(100 * s.error).toPrecision(2)}% of its largest value, from float16 values)`;
  if (!s.derive) return s.dtype === "f16" ? `carried in the page, as float16${within}` : "carried in the page";
  const names = s.derive.of.map((j) => data.steps[j].name);
  const rule = RULES[s.derive.op](...names).replace("act(", `${s.derive.fn}(`);
  return `computed in the page, as the model did: ${rule}${within}`;
}
