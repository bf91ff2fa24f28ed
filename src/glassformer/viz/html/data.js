// glassformer's attention viewer, part 1 of 3: the data and small helpers (views.js draws,
// viewer.js wires the controls). The three are classic scripts sharing the page's scope.
//
// The data is the JSON in #attention-data, written by glassformer/viz/viewer.py. Per kind
// of attention (encoder, decoder, cross) it has the token labels and three tensors as
// little-endian float32 in base64, row-major:
//   weights (L, H, Tq, Tk)   the softmax the model mixed its values with
//   q       (L, H, Tq, Dh)   the queries per head (after rotary positions, if any)
//   k       (L, Hkv, Tk, Dh) the keys per key/value head; query head h reads head h / (H / Hkv)
//   bias    (H, Tq, Tk)      what every layer adds to each score for the positions (T5), or null
// Text from the data enters the page only through textContent and setAttribute.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const data = JSON.parse(document.getElementById("attention-data").textContent);
const state = { kind: 0, layer: 0, head: 0, query: 0, key: 0, view: "head", feature: 0 };
const VIEWS = ["head", "model", "neuron", "lens", "attribution", "features"];
const decoded = new Map();
const $ = (id) => document.getElementById(id);

// ---- data ----------------------------------------------------------------------------

function floats(base64) {
  const bytes = atob(base64);
  const view = new DataView(new ArrayBuffer(bytes.length));
  for (let i = 0; i < bytes.length; i++) view.setUint8(i, bytes.charCodeAt(i));
  const out = new Float32Array(bytes.length / 4);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

function kindData() {
  if (!decoded.has(state.kind)) {
    const k = data.kinds[state.kind];
    decoded.set(state.kind, Object.assign({}, k, {
      W: floats(k.weights), Q: floats(k.q), K: floats(k.k), B: k.bias ? floats(k.bias) : null,
      nq: k.queries.length, nk: k.keys.length,
    }));
  }
  return decoded.get(state.kind);
}

function weight(K, l, h, i, j) {
  return K.W[((l * K.heads + h) * K.nq + i) * K.nk + j];
}

function queryVector(K, l, h, i) {
  const start = ((l * K.heads + h) * K.nq + i) * K.headDim;
  return K.Q.subarray(start, start + K.headDim);
}

function kvHead(K, h) {
  return Math.floor(h / (K.heads / K.kvHeads));
}

function keyVector(K, l, h, j) {
  const start = ((l * K.kvHeads + kvHead(K, h)) * K.nk + j) * K.headDim;
  return K.K.subarray(start, start + K.headDim);
}

function positionBias(K, h, i, j) {
  return K.B ? K.B[(h * K.nq + i) * K.nk + j] : 0; // T5's relative positions, else none
}

function mayAttend(K, i, j) {
  return !K.causal || j <= i + (K.nk - K.nq); // queries align to the end of the keys
}

// ---- small helpers --------------------------------------------------------------------

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) e.setAttribute(name, String(value));
  if (text !== undefined) e.textContent = text;
  return e;
}

function tag(name, text, className) {
  const e = document.createElement(name);
  if (text !== undefined) e.textContent = text;
  if (className) e.className = className;
  return e;
}

// Options' values are indices from `first` (1 for layers and heads, as their labels say).
function fillSelect(select, labels, chosen, first = 0) {
  select.replaceChildren(...labels.map((label, i) => {
    const option = tag("option", label);
    option.value = String(i + first);
    return option;
  }));
  select.value = String(chosen + first);
}

function tokenLabel(tokens, i) {
  return `${i}: ${tokens[i]}`;
}
