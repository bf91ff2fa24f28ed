// glassformer's attention viewer, part 1 of 3: the data (views.js draws, viewer.js wires the
// controls; helpers.js, loaded first, has the helpers). Classic scripts sharing the page's scope.
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

const data = JSON.parse(document.getElementById("attention-data").textContent);
const state = { kind: 0, layer: 0, head: 0, query: 0, key: 0, view: "head", feature: 0, direction: 0 };
const VIEWS = ["head", "model", "neuron", "lens", "attribution", "features", "directions", "experts"];
const decoded = new Map();

// ---- data ----------------------------------------------------------------------------

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

function tokenLabel(tokens, i) {
  return `${i}: ${tokens[i]}`;
}
