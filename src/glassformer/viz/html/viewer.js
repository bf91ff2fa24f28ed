// glassformer's attention viewer, part 3 of 3: downloads (SVG of the current view, PNG
// through a canvas) and the controls; start() runs once the page has loaded.
"use strict";

// ---- downloads ------------------------------------------------------------------------

function currentSvg() {
  if (state.view !== "model") {
    const page = $(`${state.view}-svg`).cloneNode(true);
    page.removeAttribute("id");
    page.insertBefore(svg("rect", { width: "100%", height: "100%", fill: "#fff" }), page.firstChild);
    return page;
  }
  const canvases = [...$("model-grid").querySelectorAll("canvas")];
  const K = kindData();
  const sides = canvases.flatMap((c) => [parseFloat(c.style.width), parseFloat(c.style.height)]);
  const size = Math.max(...sides);
  const gap = 24;
  const width = 70 + K.heads * (size + 8);
  const height = gap + K.layers * (size + gap);
  const page = svg("svg", { width, height, "font-family": "system-ui, sans-serif", "font-size": 11 });
  page.append(svg("rect", { width, height, fill: "#fff" }));
  for (const canvas of canvases) {
    const l = Number(canvas.dataset.layer);
    const h = Number(canvas.dataset.head);
    const x = 70 + h * (size + 8);
    const y = gap + l * (size + gap);
    if (l === 0) page.append(svg("text", { x, y: gap - 6 }, `head ${h + 1}`));
    if (h === 0) page.append(svg("text", { x: 4, y: y + size / 2 }, `layer ${l + 1}`));
    page.append(svg("image", {
      x, y, width: parseFloat(canvas.style.width), height: parseFloat(canvas.style.height),
      href: canvas.toDataURL("image/png"), "image-rendering": "pixelated", preserveAspectRatio: "none",
    }));
  }
  return page;
}

function fileName(suffix) {
  const K = data.kinds[state.kind];
  if (state.view === "lens") return `logit-lens.${suffix}`;
  if (["attribution", "features", "directions"].includes(state.view)) return `${state.view}.${suffix}`;
  if (state.view === "experts") return `experts-layer${state.layer + 1}.${suffix}`;
  return `attention-${K.kind}-${state.view}-layer${state.layer + 1}-head${state.head + 1}.${suffix}`;
}

function save(name, blob) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

function svgBlob() {
  const text = new XMLSerializer().serializeToString(currentSvg());
  return new Blob([text], { type: "image/svg+xml" });
}

function savePng() {
  const page = currentSvg();
  const width = parseFloat(page.getAttribute("width"));
  const height = parseFloat(page.getAttribute("height"));
  const image = new Image();
  const text = new XMLSerializer().serializeToString(page);
  const url = URL.createObjectURL(new Blob([text], { type: "image/svg+xml" }));
  image.onload = () => {
    const canvas = document.createElement("canvas");
    canvas.width = 2 * width;
    canvas.height = 2 * height;
    const ctx = canvas.getContext("2d");
    ctx.scale(2, 2);
    ctx.drawImage(image, 0, 0, width, height);
    URL.revokeObjectURL(url);
    canvas.toBlob((blob) => save(fileName("png"), blob), "image/png");
  };
  image.src = url;
}

// ---- controls -------------------------------------------------------------------------

function draw() {
  for (const view of VIEWS) $(`view-${view}`).hidden = view !== state.view;
  for (const tab of document.querySelectorAll(".tabs button")) {
    tab.setAttribute("aria-selected", String(tab.dataset.view === state.view));
  }
  ({
    head: drawHead, model: drawModel, neuron: drawNeuron, lens: drawLens,
    attribution: drawAttribution, features: drawFeatures, directions: drawDirections,
    experts: drawExperts,
  })[state.view]();
}

function chooseKind(index) {
  state.kind = index;
  const K = kindData();
  state.layer = Math.min(state.layer, K.layers - 1);
  state.head = Math.min(state.head, K.heads - 1);
  state.query = Math.min(state.query, K.nq - 1);
  state.key = Math.min(state.key, K.nk - 1);
  fillSelect($("layer"), Array.from({ length: K.layers }, (_, l) => String(l + 1)), state.layer, 1);
  fillSelect($("head"), Array.from({ length: K.heads }, (_, h) => String(h + 1)), state.head, 1);
  fillSelect($("query"), K.queries.map((_, i) => tokenLabel(K.queries, i)), state.query);
  fillSelect($("key"), K.keys.map((_, j) => tokenLabel(K.keys, j)), state.key);
}

function show(view) {
  state.view = view;
  draw();
}

function start() {
  document.title = data.title;
  $("title").textContent = data.title;
  $("subtitle").textContent = data.target == null ? data.text : `${data.text}\n→ ${data.target}`;
  fillSelect($("kind"), data.kinds.map((k) => k.title), 0);
  $("lens-tab").hidden = !data.lens; // a decoder-only model's logit lens, when there is one
  $("attribution-tab").hidden = !data.attribution; // glassformer attribute's page
  $("features-tab").hidden = !data.features; // glassformer features' page
  $("directions-tab").hidden = !data.directions; // glassformer attention --vector's page
  $("experts-tab").hidden = !data.experts; // a mixture of experts' routing
  if (data.open) state.view = data.open;
  if (data.directions) state.direction = data.directions.chosen;
  const first = kindData();
  state.query = first.nq - 1; // the neuron view opens on the last query and its top key
  for (let j = 0; j < first.nk; j++) {
    if (weight(first, 0, 0, state.query, j) > weight(first, 0, 0, state.query, state.key)) state.key = j;
  }
  chooseKind(0);
  $("kind").addEventListener("change", (e) => { chooseKind(Number(e.target.value)); draw(); });
  $("layer").addEventListener("change", (e) => { state.layer = Number(e.target.value) - 1; draw(); });
  $("head").addEventListener("change", (e) => { state.head = Number(e.target.value) - 1; draw(); });
  $("query").addEventListener("change", (e) => { state.query = Number(e.target.value); draw(); });
  $("key").addEventListener("change", (e) => { state.key = Number(e.target.value); draw(); });
  for (const tab of document.querySelectorAll(".tabs button")) {
    tab.addEventListener("click", () => show(tab.dataset.view));
  }
  const headSvg = $("head-svg");
  headSvg.addEventListener("mouseover", (e) => isolate(e.target.closest("[data-side]")));
  headSvg.addEventListener("mouseleave", () => isolate(null));
  headSvg.addEventListener("click", (e) => {
    const hit = e.target.closest("[data-side]");
    if (!hit) return;
    const index = Number(hit.getAttribute("data-index"));
    if (hit.getAttribute("data-side") === "q") state.query = index; else state.key = index;
    $("query").value = String(state.query);
    $("key").value = String(state.key);
    show("neuron");
  });
  $("features-svg").addEventListener("click", (e) => {
    const row = e.target.closest("#features-grid [data-row]"); // a feature's label or cell
    if (!row) return;
    state.feature = Number(row.getAttribute("data-row"));
    draw();
  });
  $("directions-svg").addEventListener("click", (e) => {
    const row = e.target.closest("#directions-grid [data-row]"); // a hook's label or cell
    if (!row) return;
    state.direction = Number(row.getAttribute("data-row"));
    draw();
  });
  $("neuron-svg").addEventListener("click", (e) => {
    const bar = e.target.closest("[data-key]");
    if (!bar) return;
    state.key = Number(bar.getAttribute("data-key"));
    $("key").value = String(state.key);
    draw();
  });
  $("model-grid").addEventListener("click", (e) => {
    const canvas = e.target.closest("canvas");
    if (!canvas) return;
    state.layer = Number(canvas.dataset.layer);
    state.head = Number(canvas.dataset.head);
    $("layer").value = String(state.layer + 1);
    $("head").value = String(state.head + 1);
    show("head");
  });
  $("download-svg").addEventListener("click", () => save(fileName("svg"), svgBlob()));
  $("download-png").addEventListener("click", savePng);
  draw();
  document.body.dataset.ready = "1";
  window.viewerReadyMs = performance.now();
}

start();
