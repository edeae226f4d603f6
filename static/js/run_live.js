// Live run page: htmx's ws extension swaps the HTML frames (status, progress, logs); this script keeps the
// charts (uPlot) and the resume position. On every (re)connect it asks the server for what it missed.
(function () {
  "use strict";
  const live = document.getElementById("live");
  if (!live) return;
  const runId = live.dataset.run;
  // Resume position: the last ingest batch (commit order) such that this page has seen it and every one before.
  // Live frames name their batch; they can arrive out of order, so only a contiguous run advances the cursor.
  let cursor = parseInt(live.dataset.cursor || "0", 10);
  const seenBatches = new Set();
  function advance() {
    for (const b of seenBatches) if (b <= cursor) seenBatches.delete(b);
    while (seenBatches.has(cursor + 1)) { seenBatches.delete(cursor + 1); cursor += 1; }
  }
  function sawBatch(b) { if (b > cursor) { seenBatches.add(b); advance(); } }
  function sawCursor(c) { if (c > cursor) { cursor = c; advance(); } }
  let opened = 0;
  const points = new Map(); // step -> {name: value}
  const names = new Set();
  let histChart = null;
  const wsState = document.getElementById("ws-state");

  function chartWidth(el) { return Math.max(300, el.clientWidth - 8); }

  // One small chart per metric (small multiples): reward, loss, KL and timings live on different scales.
  const charts = new Map(); // name -> uPlot
  const FIRST = ["reward_mean", "loss", "kl", "entropy", "clip_fraction", "tokens_per_second"];
  function order(a, b) {
    const ia = FIRST.indexOf(a), ib = FIRST.indexOf(b);
    if (ia !== ib) return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib);
    return a < b ? -1 : a > b ? 1 : 0;
  }

  function seriesData(name) {
    const steps = Array.from(points.keys()).filter((s) => name in points.get(s)).sort((a, b) => a - b);
    return [steps, steps.map((s) => points.get(s)[name])];
  }

  // Pause keeps collecting points but stops redrawing; the filter shows only the metrics whose name matches.
  let paused = false;
  let filter = "";
  function visible(name) { return !filter || name.toLowerCase().includes(filter); }
  function applyFilter() {
    for (const [name, c] of charts) c.root.parentNode.style.display = visible(name) ? "" : "none";
  }
  document.addEventListener("DOMContentLoaded", () => {
    const pause = document.getElementById("chart-pause");
    const box = document.getElementById("chart-filter");
    if (pause) pause.addEventListener("click", () => {
      paused = !paused;
      pause.textContent = paused ? "Resume updates" : "Pause updates";
      pause.setAttribute("aria-pressed", String(paused));
      if (!paused) drawMetrics();
    });
    if (box) box.addEventListener("input", () => { filter = box.value.trim().toLowerCase(); applyFilter(); });
  });

  // A chart the user zoomed keeps its zoom while new points arrive; an unzoomed one follows the data.
  function update(chart, data) {
    const xs = data[0];
    const last = chart._crucibleRange;
    const sx = chart.scales.x;
    const zoomed = last && sx.min != null && (sx.min > last[0] || sx.max < last[1]);
    chart.setData(data, !zoomed);
    if (xs.length) chart._crucibleRange = [xs[0], xs[xs.length - 1]];
  }

  function drawMetrics() {
    if (paused) return;
    const el = document.getElementById("chart-metrics");
    const cols = Array.from(names).sort(order);
    if (!cols.length) { el.textContent = "No metrics yet."; return; }
    if (!charts.size) el.textContent = "";
    cols.forEach((name, i) => {
      const data = seriesData(name);
      if (charts.has(name)) { update(charts.get(name), data); return; }
      const box = document.createElement("div");
      box.className = "small-chart";
      box.dataset.metric = name;
      el.appendChild(box);
      const palette = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
      charts.set(name, new uPlot({
        title: name, width: Math.max(240, Math.floor(el.clientWidth / 2) - 12), height: 160,
        scales: { x: { time: false } }, legend: { show: false },
        axes: [{ size: 28 }, { size: 50 }],
        series: [{ label: "step" }, { label: name, stroke: palette[i % palette.length], width: 1.5, spanGaps: true }],
      }, data, box));
    });
    // Keep the boxes in a stable, useful order as new metrics appear.
    for (const name of cols) { const c = charts.get(name); if (c) el.appendChild(c.root.parentNode); }
    for (const name of cols) { const c = charts.get(name); if (c && !c._crucibleRange && data0(name)) c._crucibleRange = data0(name); }
    applyFilter();
  }
  function data0(name) { const xs = seriesData(name)[0]; return xs.length ? [xs[0], xs[xs.length - 1]] : null; }

  function drawHistogram(h) {
    const el = document.getElementById("chart-histogram");
    if (!h || !h.counts || !h.counts.length) { el.textContent = "No distribution yet."; return; }
    const centers = h.counts.map((_, i) => (h.edges[i] + h.edges[i + 1]) / 2);
    const data = [centers, h.counts];
    if (histChart) { histChart.setData(data); return; }
    el.textContent = "";
    histChart = new uPlot({
      width: chartWidth(el), height: 260,
      scales: { x: { time: false } },
      axes: [{ label: h.name || "reward" }, { label: "trajectories" }],
      series: [{ label: h.name || "reward" }, { label: "count", fill: "rgba(37,99,235,0.35)", stroke: "#2563eb",
        paths: uPlot.paths.bars({ size: [0.95, 100] }), points: { show: false } }],
    }, data, el);
  }

  function addSeries(series) {
    for (const [name, pts] of Object.entries(series)) {
      names.add(name);
      for (const [step, value] of pts) {
        if (!points.has(step)) points.set(step, {});
        points.get(step)[name] = value;
      }
    }
  }

  function loadChart() {
    return fetch(`/runs/${runId}/chart.json`, { credentials: "same-origin" })
      .then((r) => r.json())
      .then((body) => {
        points.clear(); names.clear();
        for (const s of body.series) {
          addSeries({ [s.name]: s.steps.map((step, i) => [step, s.mean[i]]) });
        }
        drawMetrics();
      });
  }

  document.addEventListener("DOMContentLoaded", () => {
    loadChart();
    const init = document.getElementById("initial-histogram");
    drawHistogram(init ? JSON.parse(init.textContent) : null);
  });

  live.addEventListener("htmx:wsOpen", (evt) => {
    opened += 1;
    wsState.textContent = "live";
    evt.detail.socketWrapper.send(JSON.stringify({ type: "resume", after: cursor }));
    if (opened > 1) loadChart(); // metric points missed while away come back downsampled
  });
  live.addEventListener("htmx:wsClose", () => { wsState.textContent = "disconnected, reconnecting…"; });

  live.addEventListener("htmx:wsBeforeMessage", (evt) => {
    const message = evt.detail.message;
    if (message.charAt(0) === "{") {
      evt.preventDefault(); // a chart frame: ours, not htmx's
      const frame = JSON.parse(message);
      if (frame.series) { addSeries(frame.series); drawMetrics(); }
      if (frame.histogram) drawHistogram(frame.histogram);
      if (frame.batch) sawBatch(frame.batch);
      return;
    }
    const b = /data-batch="(\d+)"/.exec(message);
    if (b) sawBatch(parseInt(b[1], 10));
    const c = /data-cursor="(\d+)"/.exec(message);
    if (c) sawCursor(parseInt(c[1], 10));
  });
  live.addEventListener("htmx:wsAfterMessage", () => {
    const log = document.getElementById("run-log");
    if (log) log.scrollTop = log.scrollHeight;
    const status = document.getElementById("run-status");
    const cancel = document.getElementById("run-cancel");
    if (cancel && status && /succeeded|failed|stopped/.test(status.textContent)) cancel.hidden = true;
    const failure = document.getElementById("run-failure");
    if (failure && failure.textContent.trim()) failure.hidden = false;
  });
})();
