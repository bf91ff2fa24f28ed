// glassformer's pages (the attention viewer and the explorable forward pass): the helpers
// both use, loaded first. Classic scripts sharing the page's scope. Text from a page's data
// enters it only through textContent and setAttribute.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

// A tensor sent as base64 of little-endian float32 values, row-major.
function floats(base64) {
  const bytes = atob(base64);
  const view = new DataView(new ArrayBuffer(bytes.length));
  for (let i = 0; i < bytes.length; i++) view.setUint8(i, bytes.charCodeAt(i));
  const out = new Float32Array(bytes.length / 4);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) e.setAttribute(name, String(value));
  if (text !== undefined) e.textContent = text;
  return e;
}

// Empty an <svg> and size it: width × height pixels, the same in its own units.
function sizePage(page, width, height, fontSize = 11) {
  page.replaceChildren();
  for (const [name, value] of Object.entries({
    width, height, viewBox: `0 0 ${width} ${height}`,
    "font-family": "system-ui, sans-serif", "font-size": fontSize,
  })) page.setAttribute(name, String(value));
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
