// glassformer's live page: the model's forward pass in JavaScript, one step per hook point,
// from the weights the page carries. Each step's rule was found, and checked against the
// model's own hook cache, when the page was written (glassformer/viz/live_rules.py, whose
// run_rule is this file's twin). Loaded after explain-derive.js and live-tokenize.js.
"use strict";

// results[i]: step i's {shape, data}; a translator's ids: inputs.source and inputs.target;
// from: the first position a step computes (a translator's decoding: only the newest)
const live = { ids: [], inputs: {}, image: null, results: [], ms: 0, from: 0 };

// the ids a rule reads: the input's, or the translator's source or target that it names
function liveIds(rule) {
  return rule.ids ? live.inputs[rule.ids] : live.ids;
}
const liveWeights = new Map();

function liveWeight(name) {
  return liveWeights.get(name);
}

// The weights arrive as one run of float32 values (glassformer/viz/live_weights.py): their
// bytes plane by plane, deflated, as base85 text in the page's <template id="live-weights">
// (parsed faster there than inside the JSON). Read once, when the page opens.
const B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%:()*+-;.=,?@^_`{|}~";

function base85(text, length) {
  const digit = new Uint8Array(128);
  for (let i = 0; i < B85.length; i++) digit[B85.charCodeAt(i)] = i;
  const chars = new TextEncoder().encode(text); // (bytes: read faster than the string's characters)
  const out = new Uint8Array((chars.length / 5) * 4);
  for (let g = 0, o = 0; g < chars.length; g += 5, o += 4) {
    const v = (((digit[chars[g]] * 85 + digit[chars[g + 1]]) * 85 + digit[chars[g + 2]]) * 85
      + digit[chars[g + 3]]) * 85 + digit[chars[g + 4]];
    out[o] = v >>> 24; out[o + 1] = (v >>> 16) & 255; out[o + 2] = (v >>> 8) & 255; out[o + 3] = v & 255;
  }
  return out.subarray(0, length);
}

// what the page's weights are: float32, or float32 rounded to fewer mantissa bits
function liveWeightsSaid() {
  const bits = data.live.weights.bits;
  return bits === 23 ? "float32" : `float32 rounded to ${bits} of its 23 mantissa bits to keep the page small`;
}

async function liveUnpack() {
  const w = data.live.weights;
  const text = document.getElementById("live-weights").content.textContent;
  const inflate = new DecompressionStream("deflate");
  const writer = inflate.writable.getWriter();
  writer.write(base85(text, w.length));
  writer.close();
  const planes = new Uint8Array(await new Response(inflate.readable).arrayBuffer());
  const n = planes.length / 4;
  const words = new Uint32Array(n); // each value's four bytes, least significant first
  for (let i = 0; i < n; i++) words[i] = planes[i] | (planes[n + i] << 8) | (planes[2 * n + i] << 16) | (planes[3 * n + i] << 24);
  const values = new Float32Array(words.buffer); // (the machine's order, as the words were made)
  for (const t of w.tensors) {
    const size = t.shape.reduce((a, b) => a * b, 1);
    liveWeights.set(t.name, { shape: t.shape, data: values.subarray(t.offset, t.offset + size) });
  }
}

function liveValues(i) {
  return live.results[i].data;
}

// The ids the model reads for a text: the tokenizer's, cut to the model's length as the
// model's own inputs are (a language model keeps the last tokens, a classifier the first;
// BERT's between its [CLS] and [SEP]).
const liveTokenize = (() => {
  let encode = null;
  return (text) => {
    encode = encode || makeTokenizer(data.live.tokenizer);
    const { keep, max, cls, sep } = data.live.frame;
    const ids = encode(text);
    if (cls !== undefined) return [cls, ...ids.slice(0, max - 2), sep]; // BERT's frame
    return keep === "last" ? ids.slice(Math.max(0, ids.length - max)) : ids.slice(0, max);
  };
})();

// Run every step on ``ids`` (a ViT: on its image, C·H·W pixels 0..1); each step's values and
// shape replace the last input's.
function runLive(ids) {
  const start = performance.now();
  if (data.live.image) live.image = ids; else live.ids = ids;
  live.results = [];
  if (data.live.decode) liveTranslate(ids);
  else data.steps.forEach((s, i) => liveRun(i));
  if (data.live.decode) {
    data.labels.source = live.inputs.source.map(liveLabel);
    data.labels.target = live.inputs.target.map(liveLabel);
    data.tokens = data.labels.target;
  } else if (!data.live.image) { // a ViT's tokens are its class token and patches, whatever is drawn
    const labels = ids.map((id) => liveLabel(id));
    data.labels.input = labels;
    data.tokens = labels;
  }
  data.output = liveOutput();
  live.ms = performance.now() - start;
}

function liveRun(i) {
  const s = data.steps[i];
  live.results[i] = liveStep(s.live);
  s.shape = s.shown = live.results[i].shape;
}

// A translator: the encoder once on the source, then its greedy decoding as the model's
// generate: from BOS, the decoder run on the target so far and its likeliest next token
// appended, until EOS (not kept) or 2·source + 10 tokens (at most the model's length - 1).
// While it decodes, each new position runs alone against the earlier positions' keys and
// values, as a model with a key/value cache does; then every step is run once more on the
// whole translation, and those are the values the page shows.
function liveTranslate(source) {
  const { bos, eos } = data.live.decode;
  const decoder = [];
  const once = new Set(); // the encoder, and what reads only it (cross-attention's keys and values)
  live.inputs = { source, target: [bos] };
  data.steps.forEach((s, i) => {
    const of = s.live.of || [];
    if (s.name.startsWith("encoder.") || (of.length && of.every((j) => once.has(j)) && !s.live.ids)) {
      once.add(i);
      liveRun(i);
    } else decoder.push(i);
  });
  const head = decoder.pop(); // the logits: only the last position's, until the translation ends
  const rule = data.steps[head].live;
  const most = Math.min(data.live.frame.max - 1, 2 * source.length + 10);
  const rules = decoder.map((i) => data.steps[i].live);
  const cache = rules.some((r) => r.op === "rope") ? null // (a turn by position: rerun it all)
    : new Set(rules.filter((r) => (r.op === "scores" || r.op === "weighted") && !once.has(r.of[1])).map((r) => r.of[1]));
  const logits = []; // each position's, found as it was decoded: the head's rows
  for (;;) {
    if (cache) liveNewPosition(decoder, cache); else decoder.forEach(liveRun);
    const x = live.results[rule.of[0]];
    const D = x.shape[x.shape.length - 1];
    const last = liveCapped(rule, liveLinear(rule, { shape: [D], data: x.data.subarray(x.data.length - D) }, liveWeight(rule.weight))).data;
    logits.push(last);
    let next = 0;
    for (let v = 1; v < last.length; v++) if (last[v] > last[next]) next = v;
    if (next === eos || live.inputs.target.length - 1 >= most) break;
    live.inputs.target = [...live.inputs.target, next];
  }
  if (cache) decoder.forEach(liveRun);
  const V = logits[0].length;
  const out = new Float64Array(logits.length * V);
  logits.forEach((row, t) => out.set(row, t * V));
  live.results[head] = { shape: [logits.length, V], data: out };
  data.steps[head].shape = data.steps[head].shown = live.results[head].shape;
}

// The target's last position alone through the decoder's steps; the self-attention's keys and
// values (``kept``) gain its row beside the earlier positions'.
function liveNewPosition(decoder, kept) {
  live.from = live.inputs.target.length - 1;
  for (const i of decoder) {
    const row = liveStep(data.steps[i].live);
    live.results[i] = kept.has(i) && live.from > 0 ? liveAppend(live.results[i], row) : row;
    data.steps[i].shown = live.results[i].shape; // (derive's rules read the shapes)
  }
  live.from = 0;
}

// x (T, D) or (H, T, D), with one position's row(s) (1, D) or (H, 1, D) after its own
function liveAppend(x, row) {
  const D = x.shape[x.shape.length - 1];
  const T = x.shape[x.shape.length - 2];
  const H = x.shape.length === 3 ? x.shape[0] : 1;
  const out = new Float64Array(H * (T + 1) * D);
  for (let h = 0; h < H; h++) {
    out.set(x.data.subarray(h * T * D, (h + 1) * T * D), h * (T + 1) * D);
    out.set(row.data.subarray(h * D, (h + 1) * D), (h * (T + 1) + T) * D);
  }
  return { shape: x.shape.length === 2 ? [T + 1, D] : [H, T + 1, D], data: out };
}

// A token as shown: the run's labels, where they are not the tokenizer's own vocabulary.
function liveLabel(id) {
  const labels = data.live.labels || data.live.tokenizer.vocab;
  return labels[id] ?? `token ${id}`;
}

// the output panel's distribution, from the last step's logits
function liveOutput() {
  if (!data.live.output) return null; // a bare encoder: its last step is its output
  const logits = live.results[live.results.length - 1];
  if (data.live.output === "classes") {
    return { kind: "classes", labels: data.live.classes, logits: logits.data };
  }
  const V = logits.shape[logits.shape.length - 1];
  const T = logits.shape.length === 2 ? logits.shape[0] : 1;
  const at = (t) => { // the distribution after position t; its likeliest tokens found when asked
    const row = logits.data.subarray(t * V, (t + 1) * V);
    let top = null;
    let labels = null;
    return {
      after: t, logits: row,
      get top() { return (top = top || liveTop(row, Math.min(100, V))); },
      get labels() { return (labels = labels || this.top.map((i) => liveLabel(i))); },
    };
  };
  if (data.live.output === "translation") { // after every target position: the translation step by step
    return { kind: "translation", vocab: V, positions: Array.from({ length: T }, (_, t) => at(t)) };
  }
  return { kind: "tokens", vocab: V, positions: [at(T - 1)] };
}

// the k likeliest ids of a row of logits, likeliest first
function liveTop(row, k) {
  const least = Float64Array.from(row).sort()[row.length - k]; // (a typed sort: native, a tenth of the time)
  return [...row.keys()].filter((i) => row[i] >= least).sort((a, b) => row[b] - row[a]).slice(0, k);
}

function liveStep(rule) {
  const parts = (rule.of || []).map((j) => live.results[j]);
  const [a, b] = parts;
  const w = rule.weight ? liveWeight(rule.weight) : null;
  switch (rule.op) {
    case "embed": return liveEmbed(w, rule.scale ?? 1, liveIds(rule).slice(live.from));
    case "patches": return livePatches(rule, w);
    case "cls": return liveCls(liveSum(parts), w);
    case "rows": {
      const [T, D] = [rule.count ?? liveIds(rule).length, w.shape[1]];
      return { shape: [T - live.from, D], data: Float64Array.from(w.data.subarray(live.from * D, T * D)) };
    }
    case "linear": return liveCapped(rule, liveLinear(rule, a, w));
    case "layernorm": case "rmsnorm": { // post-norm: of a sum; Gemma's after a sub-layer: of its projection
      const x = rule.project ? liveLinear(rule.project, a, liveWeight(rule.project.weight)) : liveSum(parts);
      return liveNorm(rule, liveSegment(rule, x));
    }
    case "pool": return livePool(rule, a);
    case "scores": return liveScores(rule, a, b);
    case "softmax": case "rope": return { shape: a.shape, data: derive(rule, a.shape) }; // explain-derive.js's
    case "weighted": { // weights (H, Tq, Tk) · values (Hkv, Tk, Dv)
      const shape = [a.shape[0], a.shape[1], b.shape[2]];
      return { shape, data: derive(rule, shape) };
    }
    case "same": return a;
    case "sum": return liveSum(parts);
    case "act": return { shape: a.shape, data: a.data.map((x, i) => FUNCTIONS[rule.fn](x) * (b ? b.data[i] : 1)) };
    default: throw new Error(`no live rule ${rule.op}`); // never zeros as values
  }
}

// Gemma's logits: squashed to c·tanh(s/c) under its soft cap c
function liveCapped(rule, y) {
  if (rule.softcap) for (let i = 0; i < y.data.length; i++) y.data[i] = rule.softcap * Math.tanh(y.data[i] / rule.softcap);
  return y;
}

// BERT's embeddings: every position is in segment 0, whose row of the token-type table is added
function liveSegment(rule, x) {
  if (!rule.segment) return x;
  const types = liveWeight(rule.segment).data; // (types, D): row 0 is its first D values
  const D = x.shape[x.shape.length - 1];
  for (let i = 0; i < x.data.length; i++) x.data[i] += types[i % D];
  return x;
}

function liveSum(parts) {
  const out = Float64Array.from(parts[0].data);
  for (const part of parts.slice(1)) part.data.forEach((x, i) => { out[i] += x; });
  return { shape: parts[0].shape, data: out };
}

// The embedding's rows for the ids (times √D where the model scales them).
function liveEmbed(w, scale, ids) {
  const D = w.shape[1];
  const out = new Float64Array(ids.length * D);
  ids.forEach((id, t) => {
    for (let d = 0; d < D; d++) out[t * D + d] = w.data[id * D + d] * scale;
  });
  return { shape: [ids.length, D], data: out };
}

// x · Wᵀ + b over the rows [lo, hi) of W: x (T, in), (in,), or heads (H, T, Dh) side by side;
// out (T, out), (out,), or split in heads (heads, T, out / heads)
function liveLinear(rule, x, w) {
  const [lo, hi] = rule.rows || [0, w.shape[0]];
  const n = w.shape[1];
  const bias = rule.bias ? liveWeight(rule.bias).data : null;
  let rows;
  let input = x.data;
  if (x.shape.length === 3) { // (H, T, Dh) → (T, H·Dh)
    const [H, T, Dh] = x.shape;
    rows = T;
    input = new Float64Array(T * H * Dh);
    for (let h = 0; h < H; h++) for (let t = 0; t < T; t++) for (let d = 0; d < Dh; d++) {
      input[t * H * Dh + h * Dh + d] = x.data[(h * T + t) * Dh + d];
    }
  } else {
    rows = x.shape.length === 1 ? 1 : x.shape[0];
  }
  const m = hi - lo;
  const out = new Float64Array(rows * m);
  const W = w.data;
  for (let t = 0; t < rows; t++) { // four output features at once: each input read once for four
    const x0 = t * n;
    let o = 0;
    for (; o + 3 < m; o += 4) {
      const a = (lo + o) * n, b = a + n, c = b + n, d = c + n; // (destructuring would allocate)
      let s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (let k = 0; k < n; k++) {
        const xk = input[x0 + k];
        s0 += xk * W[a + k]; s1 += xk * W[b + k]; s2 += xk * W[c + k]; s3 += xk * W[d + k];
      }
      const at = t * m + o;
      out[at] = s0; out[at + 1] = s1; out[at + 2] = s2; out[at + 3] = s3;
    }
    for (; o < m; o++) {
      const off = (lo + o) * n;
      let sum = 0;
      for (let k = 0; k < n; k++) sum += input[x0 + k] * W[off + k];
      out[t * m + o] = sum;
    }
    if (bias) for (let j = 0; j < m; j++) out[t * m + j] += bias[lo + j];
  }
  if (rule.heads) { // (T, heads·Dh) → (heads, T, Dh)
    const Dh = m / rule.heads;
    const split = new Float64Array(out.length);
    for (let t = 0; t < rows; t++) for (let h = 0; h < rule.heads; h++) for (let d = 0; d < Dh; d++) {
      split[(h * rows + t) * Dh + d] = out[t * m + h * Dh + d];
    }
    return { shape: [rule.heads, rows, Dh], data: split };
  }
  return { shape: x.shape.length === 1 ? [m] : [rows, m], data: out };
}

function liveNorm(rule, x) {
  const n = x.shape[x.shape.length - 1];
  const weight = rule.weight ? liveWeight(rule.weight).data : null;
  const bias = rule.bias ? liveWeight(rule.bias).data : null;
  const out = new Float64Array(x.data.length);
  for (let r = 0; r < x.data.length / n; r++) {
    const row = x.data.subarray(r * n, (r + 1) * n);
    let mean = 0;
    if (rule.op === "layernorm") { for (const v of row) mean += v; mean /= n; }
    let spread = 0;
    for (const v of row) spread += (v - mean) ** 2;
    const scale = 1 / Math.sqrt(spread / n + rule.eps);
    for (let c = 0; c < n; c++) {
      const scaled = (row[c] - mean) * scale * (weight ? weight[c] + (rule.offset ?? 0) : 1);
      out[r * n + c] = scaled + (bias ? bias[c] : 0);
    }
  }
  return { shape: x.shape, data: out };
}

// A ViT's image (C, H, W) cut into patches in raster order, each · W + b: the convolution
// whose stride is its kernel, (N, D)
function livePatches(rule, w) {
  const [D, C, P, Q] = w.shape;
  const { size: [H, W] } = data.live.image;
  const bias = rule.bias ? liveWeight(rule.bias).data : null;
  const [rows, cols] = [H / P, W / Q];
  const out = new Float64Array(rows * cols * D);
  for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) for (let d = 0; d < D; d++) {
    let sum = bias ? bias[d] : 0;
    for (let ch = 0; ch < C; ch++) for (let i = 0; i < P; i++) for (let j = 0; j < Q; j++) {
      sum += live.image[(ch * H + r * P + i) * W + c * Q + j] * w.data[((d * C + ch) * P + i) * Q + j];
    }
    out[(r * cols + c) * D + d] = sum;
  }
  return { shape: [rows * cols, D], data: out };
}

// the class token, then the patches with their positions: (1 + N, D)
function liveCls(x, w) {
  const out = new Float64Array(x.data.length + w.data.length);
  out.set(w.data);
  out.set(x.data, w.data.length);
  return { shape: [x.shape[0] + 1, x.shape[1]], data: out };
}

// (T, D) → (D,): a classifier's pooling, padded positions left out
function livePool(rule, x) {
  const [T, D] = x.shape;
  const real = Array.from({ length: T }, (_, t) => rule.pad == null || live.ids[t] !== rule.pad);
  const out = new Float64Array(D);
  if (rule.how === "cls" || rule.how === "last") {
    const t = rule.how === "cls" ? 0 : Math.max(0, real.lastIndexOf(true));
    out.set(x.data.subarray(t * D, (t + 1) * D));
  } else { // mean
    const count = Math.max(1, real.filter(Boolean).length);
    for (let t = 0; t < T; t++) if (real[t]) for (let d = 0; d < D; d++) out[d] += x.data[t * D + d] / count;
  }
  return { shape: [D], data: out };
}

// the scores (explain-derive.js's rule), a padded key read from the ids
function liveScores(rule, q, k) {
  return { shape: [q.shape[0], q.shape[1], k.shape[1]], data: scoresOf(rule, q.data, q.shape, k.data, k.shape, liveIds(rule)) };
}
