// glassformer's live page: the model's own tokenizer in JavaScript, so that a typed text
// becomes the ids the Python tokenizer gives it. Three kinds, as glassformer trains them:
//   char       one id per character (Python's str.lower() where the tokenizer lower-cases)
//   wordpiece  BERT's: BertNormalizer, BertPreTokenizer, greedy longest-match pieces
//   bpe        GPT-2's byte-level BPE: its regex, bytes as characters, merges by rank
// Each follows the `tokenizers` library's steps; tests/test_viz_live.py holds them equal to
// the Python tokenizers on lines of the bundled corpora and on awkward strings.
"use strict";

// Unicode's White_Space, which Rust's char::is_whitespace and the regex library read
// (JavaScript's \s differs: it has U+FEFF and lacks U+0085)
const WHITE = "\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const IS_WHITE = new RegExp(`^[${WHITE}]$`, "u");

function makeTokenizer(spec) {
  const kinds = { char: charTokenizer, wordpiece: wordPieceTokenizer, bpe: bpeTokenizer };
  const added = spec.added || [];
  const encode = kinds[spec.type](spec);
  return (text) => splitAdded(text, added).flatMap((piece) =>
    typeof piece === "number" ? [piece] : encode(piece));
}

// The special tokens ([CLS], <pad>, ...) typed into the text are their own ids, found in the
// raw text before anything else, the longest first where two start at the same place.
function splitAdded(text, added) {
  if (!added.length) return text ? [text] : [];
  const out = [];
  let rest = "";
  let i = 0;
  while (i < text.length) {
    let found = null;
    for (const token of added) {
      if (text.startsWith(token.content, i) && (!found || token.content.length > found.content.length)) {
        found = token;
      }
    }
    if (found) {
      if (rest) out.push(rest);
      out.push(found.id);
      rest = "";
      i += found.content.length;
    } else {
      rest += text[i];
      i += 1;
    }
  }
  if (rest) out.push(rest);
  return out;
}

// ---- characters ---------------------------------------------------------------------------

function charTokenizer(spec) {
  const ids = new Map(spec.chars.map((c, i) => [c, spec.offset + i]));
  return (text) => {
    const out = [];
    for (const c of spec.lowercase ? text.toLowerCase() : text) out.push(ids.get(c) ?? spec.unk);
    return out;
  };
}

// ---- WordPiece ----------------------------------------------------------------------------

const CJK = [[0x4e00, 0x9fff], [0x3400, 0x4dbf], [0x20000, 0x2a6df], [0x2a700, 0x2b73f],
  [0x2b740, 0x2b81f], [0x2b920, 0x2ceaf], [0xf900, 0xfaff], [0x2f800, 0x2fa1f]];
const IS_OTHER = /^\p{C}$/u; // control, format, unassigned, private use, surrogate
const IS_MARK = /^\p{Mn}$/u;
const IS_PUNCTUATION = /^[\p{P}!-/:-@[-`{-~]$/u; // Unicode's punctuation and ASCII's

function bertNormalize(text, spec) {
  let out = "";
  for (const c of text) {
    const code = c.codePointAt(0);
    if (spec.cleanText) {
      if (code === 0 || code === 0xfffd || (IS_OTHER.test(c) && !"\t\n\r".includes(c))) continue;
      if (IS_WHITE.test(c)) { out += " "; continue; }
    }
    const cjk = spec.chinese && CJK.some(([lo, hi]) => code >= lo && code <= hi);
    out += cjk ? ` ${c} ` : c;
  }
  if (spec.stripAccents) out = [...out.normalize("NFD")].filter((c) => !IS_MARK.test(c)).join("");
  if (spec.lowercase) out = [...out].map((c) => c.toLowerCase()).join(""); // each alone: no final sigma
  return out;
}

function bertWords(text) {
  const words = [];
  let word = "";
  for (const c of text) {
    if (IS_WHITE.test(c) || IS_PUNCTUATION.test(c)) {
      if (word) words.push(word);
      word = "";
      if (!IS_WHITE.test(c)) words.push(c);
    } else {
      word += c;
    }
  }
  if (word) words.push(word);
  return words;
}

function wordPieceTokenizer(spec) {
  const vocab = new Map(spec.vocab.map((t, i) => [t, i]));
  const unk = vocab.get(spec.unk);
  const pieces = (word) => {
    const chars = [...word];
    if (chars.length > spec.maxChars) return [unk];
    const out = [];
    for (let start = 0; start < chars.length;) {
      let end = chars.length;
      let id;
      for (; end > start; end--) {
        id = vocab.get((start > 0 ? spec.prefix : "") + chars.slice(start, end).join(""));
        if (id !== undefined) break;
      }
      if (end === start) return [unk];
      out.push(id);
      start = end;
    }
    return out;
  };
  return (text) => bertWords(bertNormalize(text, spec)).flatMap(pieces);
}

// ---- byte-level BPE -----------------------------------------------------------------------

const GPT2_SPLIT = new RegExp(
  `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^${WHITE}\\p{L}\\p{N}]+|[${WHITE}]+(?![^${WHITE}])|[${WHITE}]+`,
  "gu",
);

// GPT-2's table: the printable bytes stand for themselves, the others for 256 + n
function byteCharacters() {
  const table = [];
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    table.push(String.fromCodePoint(printable ? b : 256 + n++));
  }
  return table;
}

function bpeTokenizer(spec) {
  const vocab = new Map(spec.vocab.map((t, i) => [t, i]));
  const rank = new Map(spec.merges.map(([a, b], r) => [`${a} ${b}`, r]));
  const bytes = byteCharacters();
  const utf8 = new TextEncoder();
  const unk = spec.unk == null ? undefined : vocab.get(spec.unk);
  const word = (piece) => {
    let symbols = Array.from(utf8.encode(piece), (b) => bytes[b]);
    const whole = symbols.join("");
    if (spec.ignoreMerges && vocab.has(whole)) return [vocab.get(whole)];
    for (;;) { // merge the adjacent pair of lowest rank, the leftmost of equals
      let best = -1;
      let bestRank = Infinity;
      for (let i = 0; i + 1 < symbols.length; i++) {
        const r = rank.get(`${symbols[i]} ${symbols[i + 1]}`);
        if (r !== undefined && r < bestRank) { best = i; bestRank = r; }
      }
      if (best < 0) break;
      symbols = [...symbols.slice(0, best), symbols[best] + symbols[best + 1], ...symbols.slice(best + 2)];
    }
    return symbols.map((s) => vocab.get(s) ?? unk).filter((id) => id !== undefined);
  };
  const seen = new Map(); // a word's ids, once merged (as the library caches them)
  const cached = (piece) => {
    if (!seen.has(piece)) {
      if (seen.size > 50000) seen.clear();
      seen.set(piece, word(piece));
    }
    return seen.get(piece);
  };
  return (text) => {
    const normal = spec.lowercase ? [...text].map((c) => c.toLowerCase()).join("") : text;
    return (normal.match(GPT2_SPLIT) || []).flatMap(cached);
  };
}
