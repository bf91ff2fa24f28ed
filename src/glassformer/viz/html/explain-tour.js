// glassformer's explorable forward pass: a guided tour for a newcomer, one forward pass of a
// one-stack model from the text to the output. Each stop opens the level it talks about (as
// the reader's own clicks would), outlines the part of the drawing it is about, and pins its
// text beside it. The stops are found from the page's own steps: a model without a part (no
// position table, no pooling) skips its stop. Loaded before explain.js, which calls them.
"use strict";

const tour = { stops: [], at: -1 };

// [where the stop opens (a step's name, a place, or the model), what it outlines, its text]
function tourStops() {
  if (data.steps.some((s) => s.name.startsWith("encoder."))) return []; // one stack: text or an image
  const image = Boolean(data.image || (data.live && data.live.image));
  const [token, tokens] = image ? ["patch", "patches"] : ["token", "tokens"];
  const first = (suffix) => data.steps.find((s) => s.name.endsWith(suffix));
  const block = (s) => (s ? s.where.split(" · ")[0] : null);
  const stops = [];
  const add = (step, target, text) => { if (step !== null) stops.push({ step, target, text }); };
  const embed = first("hook_embed");
  const pos = first("hook_pos_embed");
  const q = first("attn.hook_q");
  const scores = first("attn.hook_attn_scores");
  const pattern = first("attn.hook_pattern");
  const z = first("attn.hook_z");
  const mlp = first("mlp.hook_post");
  const post = first("hook_resid_post");
  const logits = first("hook_logits");
  add("model", "#flow", `This is the whole model: a stream of vectors, one per ${image ? "patch of the image (after a class token)" : "token"}, flowing from the embedding at the top through ${new Set(data.steps.filter((s) => /^block \d+$/.test(block(s))).map(block)).size} blocks to the output. Each block reads the stream and adds its results back.`);
  const width = embed ? embed.shape[embed.shape.length - 1] : 0;
  if (embed && image) add(embed.name, "#step-svg", `The image is cut into square patches, and each patch becomes a vector of ${width} numbers through one weight matrix (a convolution whose stride is the patch's size). A row of this grid is one patch; hover a cell for its value.`);
  else if (embed) add(embed.name, "#step-svg", `Each token becomes a vector: its row of the embedding table (${width} numbers). A row of this grid is one token; hover a cell for its value.`);
  const normed = first("ln_embed.hook_normalized"); // BERT's: the sum normalised, segment 0's vector in it
  const sum = !normed ? "" : (normed.live || {}).segment ? ", plus the vector of its segment (here every token is in the first), normalised," : ", normalised,";
  if (pos) add(pos.name, "#step-svg", `The model cannot tell order from the vectors alone, so each position adds its own vector. ${image ? "Patch" : "Token"} plus position${sum} is the stream that enters the first block.`);
  if (q) add(q.name, "#step-svg", `Inside a block, attention first: each ${token}'s vector (normalised) is multiplied by three weight matrices into a query, a key and a value for every head. This is the queries of one head (choose the head above the grid).`);
  const causal = scores && (scores.live || scores.derive || {}).mask === "causal";
  const masked = causal ? "A token may not look at later ones: those scores are masked (grey)." : `Every ${token} may look at every other, before or after it.`;
  if (scores) add(scores.name, "#step-svg", `Each query is compared with every key: a dot product, divided by √d so that it does not grow with the width. ${masked}`);
  if (pattern) add(pattern.name, "#step-svg", `Softmax turns each row of scores into weights that are positive and add up to 1: how much each ${token} reads from each ${causal ? "earlier one" : "other"}.`);
  if (z) add(z.name, "#step-svg", `Each head's output is the weighted average of the values: for every ${token}, the values of the ${tokens} it attends to, mixed by those weights. The heads are then joined and projected back into the stream.`);
  if (mlp) add(mlp.name, "#step-svg", `Then the MLP: each ${token} alone is widened, passed through a non-linearity (here, its activations), and narrowed back. This is where most of the weights are.`);
  if (post) add(post.name, "#step-svg", "The block's output: the stream with attention's and the MLP's results added. The next block reads exactly this.");
  if (logits) add(logits.name, "#output", "At the end, a final norm and the output layer turn the stream into scores for every answer; softmax makes them the probabilities on the right. Change the temperature to see them sharpen or flatten.");
  if (data.live && image) add("model", "#pad-box", "Now draw on the pad: the page runs the model on your drawing and every number you have seen changes with it.");
  else if (data.live) add("model", "#live-text", "Now type your own text in the box: the page runs the model on it and every number you have seen changes with it.");
  return stops;
}

function startTour() {
  tour.stops = tourStops();
  $("tour-start").hidden = tour.stops.length === 0;
  $("tour-start").addEventListener("click", () => showStop(0));
  $("tour-next").addEventListener("click", () => showStop(tour.at + 1));
  $("tour-back").addEventListener("click", () => showStop(tour.at - 1));
  $("tour-end").addEventListener("click", () => showStop(-1));
}

function showStop(k) {
  for (const el of document.querySelectorAll(".tour-target")) el.classList.remove("tour-target");
  const box = $("tour");
  tour.at = k >= 0 && k < tour.stops.length ? k : -1;
  box.hidden = tour.at < 0;
  if (tour.at < 0) return;
  const stop = tour.stops[tour.at];
  if (stop.step === "model") {
    state.path = [];
    state.step = null;
  } else {
    const s = data.steps.find((t) => t.name === stop.step);
    state.path = [s.where.split(" · ")[0], ...(s.where.includes(" · ") ? [s.where] : [])];
    state.step = s.index;
    state.slice = 0;
  }
  draw();
  const target = document.querySelector(stop.target);
  target.classList.add("tour-target");
  $("tour-count").textContent = `${tour.at + 1} of ${tour.stops.length}`;
  $("tour-text").textContent = stop.text;
  $("tour-back").disabled = tour.at === 0;
  $("tour-next").disabled = tour.at === tour.stops.length - 1;
  box.dataset.stop = String(tour.at);
  box.dataset.target = stop.target;
  const where = target.getBoundingClientRect(); // pinned beside the part it is about
  box.style.top = `${Math.max(8, window.scrollY + where.top)}px`;
  box.style.left = `${Math.min(window.innerWidth - 360, Math.max(8, where.right + 16))}px`;
  target.scrollIntoView({ block: "nearest" });
}
