// glassformer's attention viewer, part 2 of 3: the head view, the model view, the
// neuron view and the logit lens, each drawn from `state` and the data (data.js).
"use strict";

const MAX_LINES = 40000; // more token pairs than this: lines under MIN_WEIGHT are left out
const MIN_WEIGHT = 0.01;

// ---- head view ------------------------------------------------------------------------

function drawHead() {
  const K = kindData();
  const page = $("head-svg");
  const rows = Math.max(K.nq, K.nk);
  const pitch = rows <= 40 ? 20 : Math.max(4, Math.min(20, 800 / rows));
  const font = Math.max(10, Math.min(13, pitch * 0.75));
  const every = Math.ceil((font + 2) / pitch); // thinned labels: one every `every` rows
  const longest = Math.max(...K.queries.concat(K.keys).map((t) => Math.min(t.length, 24)));
  const labelWidth = Math.max(60, 16 + longest * font * 0.62); // room for "query" too
  const xLeft = labelWidth;
  const xRight = labelWidth + 260;
  const top = 30;
  const width = xRight + labelWidth;
  const height = top + rows * pitch + 10;
  sizePage(page, width, height, font);
  page.append(svg("text", { x: xLeft - 8, y: 16, "text-anchor": "end", "font-weight": "bold" }, "query"));
  page.append(svg("text", { x: xRight + 8, y: 16, "font-weight": "bold" }, "key"));
  const y = (i) => top + (i + 0.5) * pitch;
  const thin = K.nq * K.nk > MAX_LINES;
  const lines = svg("g", { id: "head-lines", stroke: "#1f5fa8", "stroke-width": Math.max(1, pitch / 8) });
  for (let i = 0; i < K.nq; i++) {
    for (let j = 0; j < K.nk; j++) {
      const w = weight(K, state.layer, state.head, i, j);
      if (thin && w < MIN_WEIGHT) continue;
      lines.append(svg("line", {
        x1: xLeft, y1: y(i), x2: xRight, y2: y(j), "stroke-opacity": w, "data-q": i, "data-k": j,
      }));
    }
  }
  page.append(lines);
  const side = (tokens, x, anchor, name) => {
    const g = svg("g", { class: `tokens-${name}` });
    tokens.forEach((token, i) => {
      const hit = svg("rect", {
        x: anchor === "end" ? 0 : x, y: top + i * pitch, width: labelWidth, height: pitch,
        fill: "#fff", "fill-opacity": 0, "data-side": name, "data-index": i,
      });
      hit.append(svg("title", {}, tokenLabel(tokens, i)));
      g.append(hit);
      if (i % every === 0) {
        g.append(svg("text", {
          x: anchor === "end" ? x - 8 : x + 8, y: y(i), "text-anchor": anchor,
          "dominant-baseline": "middle", "pointer-events": "none", "data-index": i,
        }, token));
      }
    });
    page.append(g);
  };
  side(K.queries, xLeft, "end", "q");
  side(K.keys, xRight, "start", "k");
  const shown = lines.childElementCount;
  $("note").textContent = `${K.title}: layer ${state.layer + 1}, head ${state.head + 1}; `
    + `${K.nq} queries × ${K.nk} keys, ${shown.toLocaleString("en")} lines`
    + (thin ? ` (over ${MAX_LINES.toLocaleString("en")} pairs: weights under ${MIN_WEIGHT} not drawn)` : "")
    + (every > 1 ? `; every ${every} tokens labelled (hover a row for its token)` : "");
}

function isolate(target) {
  const side = target && target.getAttribute("data-side");
  const index = side && target.getAttribute("data-index");
  for (const line of $("head-lines").children) {
    const hidden = side && line.getAttribute(`data-${side}`) !== index;
    line.setAttribute("visibility", hidden ? "hidden" : "visible");
  }
  for (const text of $("head-svg").querySelectorAll("text[data-index]")) {
    const own = side && text.parentNode.getAttribute("class") === `tokens-${side}`
      && text.getAttribute("data-index") === index;
    text.setAttribute("font-weight", own ? "bold" : "normal");
  }
}

// ---- model view -----------------------------------------------------------------------

function drawModel() {
  const K = kindData();
  const grid = $("model-grid");
  grid.replaceChildren();
  grid.style.gridTemplateColumns = `auto repeat(${K.heads}, max-content)`;
  const cell = Math.max(1, Math.floor(96 / Math.max(K.nq, K.nk)));
  const scale = Math.min(1, 160 / (cell * Math.max(K.nq, K.nk)));
  let top = 0;
  for (const w of K.W) top = Math.max(top, w);
  grid.append(tag("span", ""));
  for (let h = 0; h < K.heads; h++) grid.append(tag("span", `head ${h + 1}`, "label"));
  for (let l = 0; l < K.layers; l++) {
    grid.append(tag("span", `layer ${l + 1}`, "label row-label"));
    for (let h = 0; h < K.heads; h++) {
      const canvas = document.createElement("canvas");
      canvas.width = K.nk;
      canvas.height = K.nq;
      canvas.style.width = `${Math.round(K.nk * cell * scale)}px`;
      canvas.style.height = `${Math.round(K.nq * cell * scale)}px`;
      canvas.title = `layer ${l + 1} · head ${h + 1}`;
      canvas.dataset.layer = String(l);
      canvas.dataset.head = String(h);
      paintMap(canvas, K, l, h, top || 1);
      grid.append(canvas);
    }
  }
  $("note").textContent = `${K.title}: ${K.layers} layers × ${K.heads} heads, `
    + `${K.nq} queries × ${K.nk} keys; colours share one square-root scale up to ${top.toFixed(3)}`;
}

function paintMap(canvas, K, l, h, top) {
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(K.nk, K.nq);
  for (let i = 0; i < K.nq; i++) {
    for (let j = 0; j < K.nk; j++) {
      const v = Math.sqrt(weight(K, l, h, i, j) / top); // white (0) to deep blue (top)
      const p = 4 * (i * K.nk + j);
      image.data[p] = 255 - v * 247;
      image.data[p + 1] = 255 - v * 207;
      image.data[p + 2] = 255 - v * 148;
      image.data[p + 3] = 255;
    }
  }
  ctx.putImageData(image, 0, 0);
}

// ---- neuron view ----------------------------------------------------------------------

function drawNeuron() {
  const K = kindData();
  const { layer: l, head: h, query: i, key: j } = state;
  const q = queryVector(K, l, h, i);
  const k = keyVector(K, l, h, j);
  const D = K.headDim;
  const scale = K.scale ?? 1 / Math.sqrt(D); // Gemma and T5 scale the scores their own way
  const products = Array.from(q, (qd, d) => qd * k[d] * scale);
  const bias = positionBias(K, h, i, j);
  const score = products.reduce((a, b) => a + b, 0) + bias;
  // the query's whole row of scores, for the softmax the weight comes from
  const row = [];
  for (let jj = 0; jj < K.nk; jj++) {
    if (!mayAttend(K, i, jj)) continue;
    const kk = keyVector(K, l, h, jj);
    row.push(q.reduce((a, qd, d) => a + qd * kk[d], 0) * scale + positionBias(K, h, i, jj));
  }
  const peak = Math.max(...row);
  const total = row.reduce((a, s) => a + Math.exp(s - peak), 0);
  const softmax = mayAttend(K, i, j) ? Math.exp(score - peak) / total : 0;

  const notes = [
    `layer ${l + 1} · head ${h + 1}: query ${i} “${K.queries[i]}” → key ${j} “${K.keys[j]}”.`,
    `Each bar is one dimension d of the head: q_d · k_d × ${scale.toPrecision(4)}; the bars sum to the score.`,
    ...(K.notes ?? []),
  ];
  if (K.B) notes.push(`The position bias for this query and key, added to the bars' sum: ${bias.toFixed(4)}.`);
  if (K.rotary) notes.push("q and k are taken after the rotary position embedding (RoPE).");
  if (K.kvHeads !== K.heads) {
    const g = K.heads / K.kvHeads;
    notes.push(`Grouped-query attention: this key is key/value head ${kvHead(K, h) + 1} of ${K.kvHeads}, `
      + `shared by query heads ${kvHead(K, h) * g + 1}–${kvHead(K, h) * g + g}.`);
  }
  $("neuron-hint").textContent = notes.join(" ");
  const sum = $("neuron-sum");
  sum.replaceChildren(
    tag("span", K.B ? "score = Σ q_d·k_d × scale + bias = " : "score = Σ q_d·k_d × scale = "),
    valueSpan("neuron-score", score),
    tag("span", mayAttend(K, i, j)
      ? "; softmax over the query's keys gives "
      : "; masked (a later position): weight "),
    valueSpan("neuron-softmax", softmax),
    tag("span", "; the model's weight: "), valueSpan("neuron-weight", weight(K, l, h, i, j)),
  );

  const page = $("neuron-svg");
  const cellWidth = Math.max(8, Math.min(18, 900 / D));
  const left = 150;
  const keyWidth = Math.max(3, Math.min(24, Math.max(D * cellWidth, 600) / K.nk));
  const width = left + Math.max(D * cellWidth, K.nk * keyWidth) + 20;
  const barHeight = 70;
  const keysTop = 20 + 2 * 24 + 2 * barHeight + 40; // the query's weights over the keys
  const height = keysTop + 60 + 90;
  sizePage(page, width, height, 12);
  page.append(svg("rect", { x: 0, y: 0, width, height, fill: "#fff" }));
  const vectors = [["q", q, `query ${i}`], ["k", k, `key ${j}`]];
  const largest = Math.max(...Array.from(q, Math.abs), ...Array.from(k, Math.abs)) || 1;
  vectors.forEach(([name, vector, what], r) => {
    const y = 20 + r * 24;
    page.append(svg("text", { x: left - 8, y: y + 13, "text-anchor": "end" }, `${name} (${what})`));
    vector.forEach((v, d) => {
      const cell = svg("rect", {
        x: left + d * cellWidth, y, width: cellWidth - 1, height: 20,
        fill: v >= 0 ? "#1f5fa8" : "#c0392b", "fill-opacity": Math.abs(v) / largest,
        class: `cell-${name}`, "data-dim": d, "data-value": v,
      });
      cell.append(svg("title", {}, `${name}_${d} = ${v.toPrecision(5)}`));
      page.append(cell);
    });
  });
  const base = 20 + 2 * 24 + barHeight + 6;
  const most = Math.max(...products.map(Math.abs)) || 1;
  page.append(svg("text", { x: left - 8, y: base + 4, "text-anchor": "end" }, "q_d·k_d/√Dh"));
  page.append(svg("line", { x1: left, x2: left + D * cellWidth, y1: base, y2: base, stroke: "#889" }));
  products.forEach((p, d) => {
    const size = (Math.abs(p) / most) * barHeight;
    const bar = svg("rect", {
      x: left + d * cellWidth, y: p >= 0 ? base - size : base, width: cellWidth - 1, height: size,
      fill: p >= 0 ? "#1f5fa8" : "#c0392b", class: "product", "data-dim": d, "data-value": p,
    });
    bar.append(svg("title", {}, `d = ${d}: q·k/√Dh = ${p.toPrecision(5)}`));
    page.append(bar);
  });
  page.append(svg("text", { x: left, y: keysTop - 24 }, `dimension 0 … ${D - 1} of ${D}`));
  page.append(svg("text", { x: left - 8, y: keysTop + 34, "text-anchor": "end" }, `weights of query ${i}`));
  const every = Math.ceil(12 / keyWidth);
  let heaviest = 0;
  for (let jj = 0; jj < K.nk; jj++) heaviest = Math.max(heaviest, weight(K, l, h, i, jj));
  page.append(svg("text", {
    x: left - 8, y: keysTop + 50, "text-anchor": "end", "font-size": 11, fill: "#55606e",
  }, `(top ${heaviest.toFixed(3)})`));
  for (let jj = 0; jj < K.nk; jj++) {
    const w = weight(K, l, h, i, jj);
    const x = left + jj * keyWidth;
    const tall = (60 * w) / (heaviest || 1); // the heaviest key's bar is 60 high
    const bar = svg("rect", {
      x, y: keysTop + 60 - tall, width: Math.max(1, keyWidth - 1), height: Math.max(0.5, tall),
      fill: jj === j ? "#e67e22" : "#1f5fa8", class: "key-weight", "data-key": jj, cursor: "pointer",
    });
    bar.append(svg("title", {}, `${tokenLabel(K.keys, jj)}: weight ${w.toPrecision(4)} (click: this key)`));
    page.append(bar);
    if (jj % every === 0 || jj === j) {
      page.append(svg("text", {
        x: x + keyWidth / 2, y: keysTop + 66, "text-anchor": "end", "font-size": 11,
        transform: `rotate(-60 ${x + keyWidth / 2} ${keysTop + 66})`,
        "font-weight": jj === j ? "bold" : "normal",
      }, K.keys[jj]));
    }
  }
  $("note").textContent = `${K.title}: ${D} dimensions per head; click a key's weight bar to choose it`;
}

function valueSpan(id, value) {
  const span = tag("span", value.toFixed(6));
  span.id = id;
  span.dataset.value = String(value);
  return span;
}

// ---- logit lens -----------------------------------------------------------------------

function drawLens() {
  const lens = data.lens;
  const page = $("lens-svg");
  const S = lens.stages.length;
  const T = lens.inputs.length;
  const cellW = 78;
  const cellH = 20;
  const left = 90;
  const top = 10;
  const bottom = 90; // the input tokens, written upwards
  const width = left + T * cellW + 10;
  const height = top + S * cellH + bottom;
  sizePage(page, width, height, 11);
  for (let s = 0; s < S; s++) {
    const y = top + (S - 1 - s) * cellH; // the embeddings at the bottom, the output on top
    page.append(svg("text", { x: left - 6, y: y + cellH * 0.7, "text-anchor": "end" }, lens.stages[s]));
    for (let t = 0; t < T; t++) {
      const p = lens.probs[s][t];
      const tokens = lens.tokens[s][t];
      const cell = svg("g", { "data-stage": s, "data-pos": t, "data-token": tokens[0], "data-p": p[0] });
      cell.append(svg("rect", {
        x: left + t * cellW, y, width: cellW - 1, height: cellH - 1,
        fill: "#1f5fa8", "fill-opacity": p[0],
      }));
      cell.append(svg("text", {
        x: left + t * cellW + cellW / 2, y: y + cellH * 0.7, "text-anchor": "middle",
        fill: p[0] > 0.55 ? "#fff" : "#1d2430",
      }, tokens[0].slice(0, 11)));
      cell.append(svg("title", {}, tokens.map((tok, k) => `${tok}  ${p[k].toFixed(3)}`).join("\n")));
      page.append(cell);
    }
  }
  for (let t = 0; t < T; t++) {
    const x = left + t * cellW + cellW / 2;
    const y = top + S * cellH + 6;
    page.append(svg("text", {
      x, y, "text-anchor": "end", transform: `rotate(-60 ${x} ${y})`,
    }, lens.inputs[t].slice(0, 16)));
  }
  $("note").textContent = `logit lens: ${S} stages × ${T} input tokens (the layer and head do not apply)`;
}
