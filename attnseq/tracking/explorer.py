"""The attention explorer: one self-contained HTML page (inline CSS, plain JavaScript drawing inline SVG, the
data as inline JSON; nothing fetched, so it opens from MLflow's artifact view and from disk alike).

Pick a sample, an epoch (a training run's), an attention map (the cross-attention, or a Transformer's
encoder or decoder self-attention of one layer) and a head (or the mean over heads); hover a cell for the
tokens and the weight. The gold source position (where the task has one) is circled, each row's argmax
crossed; beside the cross-attention, the same step's importance by each measure (gradient × input,
integrated gradients, leave-one-out; each row scaled to its maximum), with each step's Kendall τ against
the attention. The data: ``attnseq.faithfulness.explorer.explorer_samples``' entries, per epoch.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence

__all__ = ["DATA_ID", "comparison_explorer_html", "explorer_data", "explorer_html"]

DATA_ID = "explorer-data"
"""The id of the ``<script type="application/json">`` element holding the page's data."""

MEASURE_NAMES = {"grad_x_input": "gradient × input", "integrated_gradients": "integrated gradients",
                 "leave_one_out": "leave-one-out"}


def explorer_html(title: str, epochs: Sequence[dict], note: str = "") -> str:
    """The page. ``epochs``: ``{"label": "epoch 3", "samples": [explorer_samples' entries]}``, oldest first;
    the last is shown first. ``note``: a line under the title (what was evaluated, how it decoded)."""
    return _page(title, {"title": title, "note": note, "epochs": list(epochs), "measure_names": MEASURE_NAMES})


def _page(title: str, data: dict) -> str:
    payload = json.dumps(data, ensure_ascii=False, allow_nan=False).replace("</", "<\\/")  # no early </script>
    return (PAGE.replace("__TITLE__", html.escape(title)).replace("__DATA_ID__", DATA_ID)
            .replace("__DATA__", payload))


def comparison_explorer_html(title: str, runs: Sequence[str], samples: Sequence[dict], note: str = "") -> str:
    """A comparison's page: the same samples as each run attends to them, two runs side by side with their
    difference and each step's Jensen–Shannon divergence. ``samples``: ``{"label", "source", "rows"`` (the
    steps' target tokens), ``"gold"`` (or None), ``"attention"``: per run ``(T, T_src)`` (mean over heads)``}``."""
    data = {"title": title, "note": note, "epochs": [], "measure_names": MEASURE_NAMES,
            "compare": {"runs": list(runs), "samples": list(samples)}}
    return _page(title, data)


def explorer_data(page: str) -> dict:
    """The data ``explorer_html`` put into ``page``, read back (what a script or a test checks)."""
    [payload] = re.findall(rf'<script type="application/json" id="{DATA_ID}">(.*?)</script>', page, re.S)
    return json.loads(payload.replace("<\\/", "</"))


PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px 20px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; } .note { color: #555; margin: 0 0 10px; }
.controls { display: flex; flex-wrap: wrap; gap: 14px; align-items: center; margin: 8px 0; padding: 8px 10px;
  background: #f4f6f8; border-radius: 6px; }
.controls label { font-weight: 600; } select { font-size: 14px; margin-left: 4px; }
.texts { margin: 6px 0 10px; font-family: ui-monospace, monospace; font-size: 13px; }
.texts b { font-family: system-ui, sans-serif; display: inline-block; width: 84px; }
.ok { color: #1a7f37; font-weight: 600; } .bad { color: #c62828; font-weight: 600; }
.panels { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
.panel { border: 1px solid #dde; border-radius: 6px; padding: 6px 8px; background: #fff; }
.panel h2 { font-size: 14px; margin: 0 0 2px; } .panel .sub { color: #666; font-size: 12px; margin: 0 0 4px; }
.legend { color: #444; font-size: 12px; margin: 8px 0; }
.help { color: #444; font-size: 13px; max-width: 1100px; }
#tooltip { position: fixed; pointer-events: none; background: #222; color: #fff; padding: 6px 8px;
  border-radius: 4px; font-size: 13px; display: none; max-width: 420px; z-index: 10; white-space: pre-line; }
svg text { font-family: ui-monospace, monospace; font-size: 11px; fill: #222; }
svg rect.cell:hover { stroke: #ff9800; stroke-width: 2; }
</style></head>
<body>
<h1 id="title"></h1><p class="note" id="note"></p>
<p class="help" id="help">Each row is a decoder step (the token the model output), each column a source token; a cell's
colour is the weight that step gave that token (white 0, dark blue 1). <b>×</b> marks each row's largest value,
<b style="color:#c62828">○</b> the gold source position where the task has one. The panels to the right score
the same steps by other measures of importance (each row scaled to its own maximum); τ is Kendall's rank
correlation of the attention (mean over heads) with that measure at that step: near 1 they rank the source
alike, near 0 or below they disagree. Hover a cell for the tokens and values.</p>
<div class="controls">
 <span><label for="sample">Sample</label><select id="sample"></select></span>
 <span id="epoch-box"><label for="epoch">Epoch</label><select id="epoch"></select></span>
 <span id="map-box"><label for="map">Attention</label><select id="map"></select></span>
 <span id="head-box"><label for="head">Head</label><select id="head"></select></span>
 <span id="run-box" style="display: none"><label for="run-a">Runs</label><select id="run-a"></select>
  <label for="run-b">against</label><select id="run-b"></select></span>
</div>
<div class="texts" id="texts"></div>
<div class="panels" id="panels"></div>
<div class="legend" id="legend"></div>
<div id="tooltip"></div>
<script type="application/json" id="__DATA_ID__">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("__DATA_ID__").textContent);
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const CELL = 22, tip = $("tooltip");
const fmt = (v) => (v === null || v === undefined) ? "—" : Number(v).toFixed(4);

function el(name, attrs, parent) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}
function option(select, value, text) {
  const o = document.createElement("option"); o.value = value; o.textContent = text; select.appendChild(o);
}
function colour(v, hue) {  // 0 → white, 1 → saturated
  if (v === null || v === undefined || !isFinite(v)) return "#eee";
  const x = Math.max(0, Math.min(1, Math.abs(v)));
  if (hue === "diff") return v >= 0 ? `rgb(255,${Math.round(255 - 200 * x)},${Math.round(255 - 200 * x)})`
                                    : `rgb(${Math.round(255 - 200 * x)},${Math.round(255 - 200 * x)},255)`;
  return hue === "green" ? `rgb(${Math.round(255 - 200 * x)},${Math.round(255 - 105 * x)},${Math.round(255 - 190 * x)})`
                         : `rgb(${Math.round(255 - 225 * x)},${Math.round(255 - 165 * x)},${Math.round(255 - 75 * x)})`;
}
function meanHeads(heads) {
  return heads[0].map((row, t) => row.map((_, s) => heads.reduce((a, h) => a + h[t][s], 0) / heads.length));
}
function epoch() { return DATA.epochs[Number($("epoch").value)]; }
function sample() { return epoch().samples[Number($("sample").value)]; }

// one grid: rows × cols matrix, row/col labels, marks; describe(t, s) → tooltip text
function grid(parent, title, sub, matrix, rowLabels, colLabels, opts) {
  const panel = document.createElement("div"); panel.className = "panel";
  panel.dataset.panel = opts.kind;
  const h = document.createElement("h2"); h.textContent = title; panel.appendChild(h);
  const p = document.createElement("p"); p.className = "sub"; p.textContent = sub; panel.appendChild(p);
  const longest = (xs) => Math.max(1, ...xs.map((x) => x.length));
  const left = opts.rowText ? 14 + 7 * longest(rowLabels) : 4, top = 30 + 6 * longest(colLabels);
  const extra = opts.extraColumn ? 52 : 0;
  const w = left + colLabels.length * CELL + extra + 6, hgt = top + rowLabels.length * CELL + 6;
  const svg = el("svg", {width: w, height: hgt, "data-kind": opts.kind}, panel);
  colLabels.forEach((c, s) => {
    const x = left + s * CELL + CELL / 2;
    const tx = el("text", {x: x, y: top - 6, transform: `rotate(-55 ${x} ${top - 6})`}, svg); tx.textContent = c;
  });
  if (opts.extraColumn) {
    const tx = el("text", {x: left + colLabels.length * CELL + 8, y: top - 6}, svg);
    tx.textContent = opts.extraHeader || "τ";
  }
  rowLabels.forEach((r, t) => {
    const y = top + t * CELL;
    if (opts.rowText) {
      const tx = el("text", {x: left - 6, y: y + CELL * 0.68, "text-anchor": "end"}, svg); tx.textContent = r;
    }
    const row = matrix[t];
    const finite = row ? row.filter((v) => v !== null && isFinite(v)) : [];
    const peak = finite.length ? Math.max(...finite) : null;
    const scale = opts.rowScaled && peak ? peak : opts.scale || 1;
    colLabels.forEach((_, s) => {
      const v = row ? row[s] : null;
      const rect = el("rect", {x: left + s * CELL, y: y, width: CELL - 1, height: CELL - 1, class: "cell",
                               fill: colour(v === null ? null : v / scale, opts.hue), "data-row": t, "data-col": s},
                      svg);
      rect.addEventListener("mousemove", (ev) => show(ev, opts.describe(t, s)));
      rect.addEventListener("mouseleave", hide);
      if (peak !== null && v === peak && peak > 0)
        { const m = el("text", {x: left + s * CELL + CELL / 2, y: y + CELL * 0.72, "text-anchor": "middle",
                                class: "argmax", "pointer-events": "none"}, svg); m.textContent = "×"; }
      if (opts.gold && opts.gold[t] === s)
        el("circle", {cx: left + s * CELL + CELL / 2 - 0.5, cy: y + CELL / 2 - 0.5, r: CELL / 2 - 2.5, fill: "none",
                      stroke: "#c62828", "stroke-width": 1.8, class: "gold", "pointer-events": "none"}, svg);
    });
    if (opts.extraColumn) {
      const tv = opts.extraColumn[t];
      const tx = el("text", {x: left + colLabels.length * CELL + 8, y: y + CELL * 0.68}, svg);
      tx.textContent = tv === null || tv === undefined ? "—" : Number(tv).toFixed(2);
    }
  });
  parent.appendChild(panel);
}
function show(ev, text) {
  tip.textContent = text; tip.style.display = "block";
  tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 14) + "px";
}
function hide() { tip.style.display = "none"; }

function fillMaps() {
  const cur = $("map").value, s = sample(), map = $("map");
  map.innerHTML = ""; option(map, "cross", "cross-attention (decoder → source)");
  for (const [stack, layers] of Object.entries(s.self_attention || {}))
    layers.forEach((_, l) => option(map, `${stack}:${l}`, `${stack} self-attention, layer ${l + 1}`));
  if ([...map.options].some((o) => o.value === cur)) map.value = cur;
  fillHeads();
}
function mapHeads() {
  const s = sample(), v = $("map").value;
  if (v === "cross") return {heads: s.attention, labels: s.heads};
  const [stack, l] = v.split(":"), heads = s.self_attention[stack][Number(l)];
  return {heads: heads, labels: heads.map((_, h) => `head ${h}`)};
}
function fillHeads() {
  const cur = $("head").value, head = $("head"), {labels} = mapHeads();
  head.innerHTML = ""; option(head, "mean", labels.length > 1 ? "mean over heads" : labels[0]);
  if (labels.length > 1) labels.forEach((name, h) => option(head, String(h), name));
  if ([...head.options].some((o) => o.value === cur)) head.value = cur;
  draw();
}

function draw() {
  const s = sample(), panels = $("panels"); panels.innerHTML = ""; hide();
  const {heads, labels} = mapHeads(), hv = $("head").value;
  const matrix = hv === "mean" ? meanHeads(heads) : heads[Number(hv)];
  const headName = hv === "mean" ? (labels.length > 1 ? "mean over heads" : labels[0]) : labels[Number(hv)];
  const v = $("map").value, verdict = s.correct ? '<span class="ok">correct</span>' : '<span class="bad">wrong</span>';
  const esc = (xs) => xs.map((x) => x.replace(/&/g, "&amp;").replace(/</g, "&lt;")).join(" ");
  $("texts").innerHTML = `<div><b>source</b>${esc(s.source)}</div><div><b>output</b>${esc(s.output)} (${verdict})</div>`
    + (s.reference.length ? `<div><b>reference</b>${esc(s.reference)}</div>` : "");
  let rows = s.output, cols = s.source, what = "attention", gold = s.gold;
  if (v !== "cross") {
    const stack = v.split(":")[0];
    rows = cols = stack === "encoder" ? s.source : ["<bos>", ...s.output.slice(0, -1)];
    gold = null; what = `${stack} self-attention`;
  }
  const measures = Object.keys(s.importance || {});
  const tauOf = (t) => measures.map((m) => `τ(${DATA.measure_names[m] || m}) ${fmt(s.tau[m][t])}`).join(", ");
  grid(panels, v === "cross" ? "Cross-attention" : `${what}, layer ${Number(v.split(":")[1]) + 1}`,
       `${headName} · rows: ${v === "cross" ? "output tokens" : "queries"} · columns: ${v === "cross" ? "source tokens" : "keys"}`,
       matrix, rows, cols, {kind: "attention", rowText: true, gold: gold, describe: (t, c) => {
         let text = `${v === "cross" ? "output" : "query"} “${rows[t]}” (step ${t + 1}) → ${v === "cross" ? "source" : "key"} “${cols[c]}” (position ${c + 1})\n${what} (${headName}): ${fmt(matrix[t][c])}`;
         if (v === "cross") {
           for (const m of measures) text += `\n${DATA.measure_names[m] || m}: ${fmt(s.importance[m][t] && s.importance[m][t][c])}`;
           if (gold) text += `\ngold source position: ${gold[t] >= 0 ? `“${cols[gold[t]]}” (${gold[t] + 1})` : "none"}`;
         }
         return text; }});
  if (v === "cross") {
    if (!measures.length)
      { const p = document.createElement("p"); p.className = "sub"; p.dataset.panel = "no-importance";
        p.textContent = "Importance measures: computed for the last epoch only (pick it above)."; panels.appendChild(p); }
    for (const m of measures) {
      const name = DATA.measure_names[m] || m;
      grid(panels, name, "each row scaled to its maximum · τ: vs the attention", s.importance[m],
           rows, cols, {kind: m, hue: "green", rowScaled: true, rowText: true, gold: gold, extraColumn: s.tau[m], describe: (t, c) =>
             `output “${rows[t]}” (step ${t + 1}) → source “${cols[c]}” (position ${c + 1})\n${name}: ${fmt(s.importance[m][t] && s.importance[m][t][c])}\nattention (${headName}): ${fmt(matrix[t][c])}\n${tauOf(t)}`});
    }
  }
  $("legend").textContent = `Sample “${s.label}”: ${s.source.length} source tokens, ${s.output.length} output tokens`
    + (s.gold ? "; ○ gold source position" : "; no gold alignment for this task") + "; × the largest value in each row.";
}

// a comparison: two runs' attention to the same sample, teacher-forced with its reference
function jsd(p, q) {
  const sp = p.reduce((a, b) => a + b, 0) || 1, sq = q.reduce((a, b) => a + b, 0) || 1;
  let d = 0;
  p.forEach((pi, i) => { const a = pi / sp, b = q[i] / sq, m = (a + b) / 2;
    if (a > 0) d += 0.5 * a * Math.log(a / m); if (b > 0) d += 0.5 * b * Math.log(b / m); });
  return d;
}
function drawCompare() {
  const C = DATA.compare, s = C.samples[Number($("sample").value)], panels = $("panels"); panels.innerHTML = ""; hide();
  const a = Number($("run-a").value), b = Number($("run-b").value), A = s.attention[a], B = s.attention[b];
  const esc = (xs) => xs.map((x) => x.replace(/&/g, "&amp;").replace(/</g, "&lt;")).join(" ");
  $("texts").innerHTML = `<div><b>source</b>${esc(s.source)}</div><div><b>reference</b>${esc(s.rows)}</div>`;
  const diff = A.map((row, t) => row.map((v, c) => v - B[t][c])), div = A.map((row, t) => jsd(row, B[t]));
  const tell = (t, c) => `target “${s.rows[t]}” (step ${t + 1}) → source “${s.source[c]}” (position ${c + 1})\n`
    + `${C.runs[a]}: ${fmt(A[t][c])}\n${C.runs[b]}: ${fmt(B[t][c])}\ndifference: ${fmt(diff[t][c])}\nJSD of the step: ${fmt(div[t])}`;
  const sub = "mean over heads · rows: the reference's steps";
  grid(panels, C.runs[a], sub, A, s.rows, s.source, {kind: "run-a", rowText: true, gold: s.gold, describe: tell});
  grid(panels, C.runs[b], sub, B, s.rows, s.source, {kind: "run-b", rowText: true, gold: s.gold, describe: tell});
  grid(panels, "difference (first − second)", "red: the first attends more · blue: the second (scaled to the largest)", diff, s.rows,
       s.source, {kind: "difference", hue: "diff", rowText: true, extraColumn: div, extraHeader: "JSD",
                  scale: Math.max(1e-9, ...diff.flat().map(Math.abs)), describe: tell});
  $("legend").textContent = "The last column: each step's Jensen–Shannon divergence of the two runs' attention "
    + "(natural log: 0 the same, ln 2 ≈ 0.693 no overlap). Both runs are teacher-forced with the reference, so "
    + "their rows are the same steps.";
}
function setupCompare() {
  const C = DATA.compare;
  $("help").textContent = "The same samples as two of the compared runs attend to them: pick the two runs. Each "
    + "row is a step of the reference (both runs teacher-forced with it), each column a source token; the "
    + "third grid is their difference. Hover a cell for the tokens and both weights.";
  for (const id of ["epoch-box", "map-box", "head-box"]) $(id).style.display = "none";
  $("run-box").style.display = "";
  C.samples.forEach((s, i) => option($("sample"), String(i), `${s.label} (source length ${s.source.length})`));
  C.runs.forEach((name, i) => { option($("run-a"), String(i), name); option($("run-b"), String(i), name); });
  $("run-b").value = String(Math.min(1, C.runs.length - 1));
  $("sample").value = String(Math.floor(C.samples.length / 2));  // the middle length, not the shortest
  for (const id of ["sample", "run-a", "run-b"]) $(id).addEventListener("change", drawCompare);
  drawCompare();
}

function fillSamples() {
  const cur = $("sample").value, sel = $("sample"); sel.innerHTML = "";
  epoch().samples.forEach((s, i) => option(sel, String(i), `${s.label} (source length ${s.source.length})`));
  const middle = String(Math.floor(epoch().samples.length / 2));  // first shown: the middle length, not the shortest
  sel.value = [...sel.options].some((o) => o.value === cur) ? cur : middle;
  fillMaps();
}
$("title").textContent = DATA.title; $("note").textContent = DATA.note;
if (DATA.compare) setupCompare(); else {
DATA.epochs.forEach((e, i) => option($("epoch"), String(i), e.label));
$("epoch").value = String(DATA.epochs.length - 1);
if (DATA.epochs.length < 2) $("epoch-box").style.display = "none";
$("epoch").addEventListener("change", fillSamples);
$("sample").addEventListener("change", fillMaps);
$("map").addEventListener("change", fillHeads);
$("head").addEventListener("change", draw);
fillSamples();
}
</script></body></html>
"""  # noqa: E501 (the page's JavaScript)
