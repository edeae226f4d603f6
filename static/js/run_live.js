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
  const C = window.CrucibleCharts;

  // Charts grouped by the metric name's prefix (train/, reward/, env/, eval/, ...; names without one are "train"),
  // the pinned ones first in the user's order; sections start folded except the pinned one. The layout (pinned,
  // hidden, open sections, smoothing, log scales, x-axis) is the user's for this run's scope, saved on the server
  // (apps/runs/layouts.py): it follows the user, and one user's pins are not another's.
  const GROUP_ORDER = ["key", "train", "reward", "rollout", "env", "eval", "term", "detector", "flags"];
  const charts = new Map(); // name -> uPlot
  C.live = charts; // for the browser tests (tests/browser/flows.mjs) and the console
  const layout = (() => {
    const fresh = { pinned: [], hidden: [], open: ["key"], log: [], smoothing: 0, x: "step" };
    try {
      const kept = JSON.parse((document.getElementById("panel-layout") || {}).textContent || "{}") || {};
      const list = (v) => (Array.isArray(v) ? v.filter((n) => typeof n === "string") : []);
      return {
        pinned: list(kept.pinned), hidden: list(kept.hidden), open: Array.isArray(kept.open) ? list(kept.open) : ["key"],
        log: list(kept.log), smoothing: Math.min(0.99, Math.max(0, Number(kept.smoothing) || 0)),
        x: kept.x === "time" ? "time" : "step",
      };
    } catch (err) { return fresh; }
  })();
  let saveTimer = null;
  const saved = document.getElementById("chart-layout-state");
  function saveLayout() {
    clearTimeout(saveTimer);
    saveTimer = setTimeout(() => {
      let token = "";
      try { token = JSON.parse(document.body.getAttribute("hx-headers") || "{}")["X-CSRFToken"] || ""; } catch (err) { /* none */ }
      fetch(`/runs/${runId}/layout/`, {
        method: "POST", credentials: "same-origin", body: JSON.stringify(layout),
        headers: { "Content-Type": "application/json", "X-CSRFToken": token },
      }).then((r) => { if (saved) saved.textContent = r.ok ? "layout saved" : `layout not saved (${r.status})`; })
        .catch(() => { if (saved) saved.textContent = "layout not saved (offline)"; });
    }, 300);
  }
  function groupOf(name) {
    if (layout.pinned.includes(name)) return "key";
    return name.includes("/") ? name.split("/")[0] : "train";
  }
  function order(a, b) {
    const ia = layout.pinned.indexOf(a), ib = layout.pinned.indexOf(b);
    if (ia !== ib) return (ia < 0 ? 9999 : ia) - (ib < 0 ? 9999 : ib);
    return a < b ? -1 : a > b ? 1 : 0;
  }
  function groupRank(g) { const i = GROUP_ORDER.indexOf(g); return i < 0 ? 50 : i; }

  // The x-axis: steps, or wall time since the first point (step -> time from chart.json, live steps by arrival).
  let times = { steps: [], epoch: [] };
  const liveTimes = new Map();
  function seriesData(name) {
    const steps = Array.from(points.keys()).filter((s) => name in points.get(s)).sort((a, b) => a - b);
    const ys = steps.map((s) => points.get(s)[name]);
    if (layout.x !== "time") return [steps, ys];
    const clock = C.stepClock(times, liveTimes);
    return [steps.map(clock), ys];
  }

  // Pause keeps collecting points but stops redrawing; the filter shows only the metrics whose name matches.
  let paused = false;
  let filter = "";
  function visible(name) { return !filter || name.toLowerCase().includes(filter); }
  function applyFilter() {
    for (const [name, c] of charts) c.root.closest(".small-chart").style.display = visible(name) ? "" : "none";
    document.querySelectorAll("#chart-metrics .chart-group").forEach((g) => {
      const shown = Array.from(g.querySelectorAll(".small-chart")).some((b) => b.style.display !== "none");
      g.style.display = shown ? "" : "none";
    });
  }
  document.addEventListener("DOMContentLoaded", () => {
    const pause = document.getElementById("chart-pause");
    const box = document.getElementById("chart-filter");
    const smooth = document.getElementById("chart-smoothing");
    const smoothOut = document.getElementById("chart-smoothing-value");
    if (pause) pause.addEventListener("click", () => {
      paused = !paused;
      pause.textContent = paused ? "Resume updates" : "Pause updates";
      pause.setAttribute("aria-pressed", String(paused));
      if (!paused) drawMetrics();
    });
    if (box) box.addEventListener("input", () => { filter = box.value.trim().toLowerCase(); applyFilter(); });
    const xAxis = document.getElementById("chart-x");
    if (xAxis) {
      xAxis.value = layout.x;
      xAxis.addEventListener("change", () => { layout.x = xAxis.value; saveLayout(); rebuildAll(); });
    }
    if (smooth) {
      smooth.value = String(layout.smoothing);
      if (smoothOut) smoothOut.textContent = Number(layout.smoothing).toFixed(2);
      smooth.addEventListener("input", () => {
        layout.smoothing = Number(smooth.value);
        if (smoothOut) smoothOut.textContent = layout.smoothing.toFixed(2);
        saveLayout();
        rebuildAll();
      });
    }
  });

  // A chart the user zoomed keeps its zoom while new points arrive; an unzoomed one follows the data.
  function update(chart, name) {
    const [xs, ys] = seriesData(name);
    const last = chart._crucibleRange;
    const sx = chart.scales.x;
    const zoomed = last && sx.min != null && (sx.min > last[0] || sx.max < last[1]);
    chart._crucible.xs = xs;
    chart._crucible.lines[0].ys = ys;
    chart.setData(C.chartData(xs, chart._crucible.lines, layout.smoothing), !zoomed);
    if (xs.length) chart._crucibleRange = [xs[0], xs[xs.length - 1]];
  }

  function groupBox(el, group) {
    let box = el.querySelector(`.chart-group[data-group="${CSS.escape(group)}"]`);
    if (box) return box.querySelector(".chart-grid");
    box = document.createElement("details");
    box.className = "chart-group";
    box.dataset.group = group;
    box.open = layout.open.includes(group);
    const title = document.createElement("summary");
    title.textContent = group === "key" ? "pinned" : group;
    box.appendChild(title);
    const grid = document.createElement("div");
    grid.className = "chart-grid";
    box.appendChild(grid);
    box.addEventListener("toggle", () => {
      if (box.open === layout.open.includes(group)) return;
      layout.open = layout.open.filter((g) => g !== group);
      if (box.open) layout.open.push(group);
      saveLayout();
    });
    const groups = Array.from(el.querySelectorAll(".chart-group"));
    const after = groups.find((g) => groupRank(g.dataset.group) > groupRank(group) ||
      (groupRank(g.dataset.group) === groupRank(group) && g.dataset.group > group));
    el.insertBefore(box, after || null);
    return grid;
  }

  function build(name, holder) {
    const [xs, ys] = seriesData(name);
    const plot = holder.querySelector(".plot");
    plot.textContent = "";
    const width = Math.max(240, Math.floor(document.getElementById("chart-metrics").clientWidth / 2) - 24);
    const chart = C.lineChart(plot, xs, [{ label: name, ys: ys }], {
      title: name, width: width, height: 170, smoothing: layout.smoothing, log: layout.log.includes(name),
      sync: `run-${runId}`, xMode: layout.x,
    });
    const logButton = holder.querySelector('[data-act="log"]');
    logButton.setAttribute("aria-pressed", String(chart._crucible.log));
    logButton.title = layout.log.includes(name) && !chart._crucible.log
      ? "log scale needs values above 0: this metric has some at or below 0" : "logarithmic y-axis";
    if (xs.length) chart._crucibleRange = [xs[0], xs[xs.length - 1]];
    charts.set(name, chart);
    return chart;
  }

  function rebuildAll() {
    for (const [name, chart] of Array.from(charts)) {
      const holder = chart.root.closest(".small-chart");
      chart.destroy();
      build(name, holder);
    }
    applyFilter();
  }

  function newChart(el, name) {
    const holder = document.createElement("div");
    holder.className = "small-chart";
    holder.dataset.metric = name;
    const pinned = layout.pinned.includes(name);
    holder.innerHTML = '<div class="chart-tools">' +
      (pinned ? '<button type="button" data-act="left" title="move left">&larr;</button>' +
        '<button type="button" data-act="right" title="move right">&rarr;</button>' +
        '<button type="button" data-act="unpin" title="unpin">unpin</button>'
        : '<button type="button" data-act="pin" title="pin to the top">pin</button>') +
      '<button type="button" data-act="hide" title="hide this panel">hide</button>' +
      '<button type="button" data-act="log" aria-pressed="false">log</button>' +
      '<button type="button" data-act="csv">CSV</button><button type="button" data-act="png">PNG</button></div>' +
      '<div class="plot"></div>';
    groupBox(el, groupOf(name)).appendChild(holder);
    holder.querySelector(".chart-tools").addEventListener("click", (evt) => {
      const act = evt.target.dataset && evt.target.dataset.act;
      const chart = charts.get(name);
      if (!act || !chart) return;
      if (act === "csv") C.exportCsv(`run${runId}-${name}`, chart._crucible.xs, chart._crucible.lines);
      if (act === "png") C.exportPng(`run${runId}-${name}`, chart);
      if (act === "pin" || act === "unpin" || act === "hide" || act === "left" || act === "right") {
        arrange(name, act);
        return;
      }
      if (act === "log") {
        layout.log = layout.log.includes(name) ? layout.log.filter((n) => n !== name) : layout.log.concat([name]);
        saveLayout();
        chart.destroy();
        build(name, holder);
      }
    });
    build(name, holder);
  }

  // Pin, unpin, move a pinned panel, hide: the layout changes, is saved, and the panels are laid out again.
  function arrange(name, act) {
    const at = layout.pinned.indexOf(name);
    if (act === "pin" && at < 0) layout.pinned.push(name);
    if (act === "unpin") layout.pinned = layout.pinned.filter((n) => n !== name);
    if (act === "hide") { layout.hidden = layout.hidden.concat([name]); layout.pinned = layout.pinned.filter((n) => n !== name); }
    if (act === "show") layout.hidden = layout.hidden.filter((n) => n !== name);
    const to = act === "left" ? at - 1 : act === "right" ? at + 1 : -1;
    if (at >= 0 && to >= 0 && to < layout.pinned.length) {
      layout.pinned.splice(at, 1);
      layout.pinned.splice(to, 0, name);
    }
    saveLayout();
    for (const chart of charts.values()) chart.destroy();
    charts.clear();
    document.getElementById("chart-metrics").textContent = "";
    drawMetrics();
  }

  function drawHidden() {
    const box = document.getElementById("chart-hidden");
    if (!box) return;
    const hidden = layout.hidden.filter((n) => names.has(n));
    box.hidden = !hidden.length;
    box.textContent = hidden.length ? `Hidden (${hidden.length}): ` : "";
    for (const name of hidden) {
      const b = document.createElement("button");
      b.type = "button";
      b.dataset.show = name;
      b.textContent = `show ${name}`;
      b.addEventListener("click", () => arrange(name, "show"));
      box.appendChild(b);
    }
  }

  function drawMetrics() {
    if (paused) return;
    const el = document.getElementById("chart-metrics");
    drawHidden();
    const cols = Array.from(names).filter((n) => !layout.hidden.includes(n)).sort(order);
    if (!cols.length) { el.textContent = "No metrics yet."; return; }
    if (!charts.size) el.textContent = "";
    for (const name of cols) {
      if (charts.has(name)) update(charts.get(name), name);
      else newChart(el, name);
    }
    // Keep each group's charts in a stable, useful order as new metrics appear.
    for (const name of cols) { const c = charts.get(name); if (c) { const h = c.root.closest(".small-chart"); h.parentNode.appendChild(h); } }
    applyFilter();
  }

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

  // Distributions over steps (reward, sampled tokens, turns) from the stored trajectories; refetched at most every
  // 5 s while the run streams.
  const DISTRIBUTIONS = [["reward", "reward"], ["completion_tokens", "sampled tokens"], ["num_turns", "turns"]];
  let distributionsAt = 0;
  function loadDistributions(force) {
    const box = document.getElementById("chart-distributions");
    if (!box || (!force && Date.now() - distributionsAt < 5000)) return;
    distributionsAt = Date.now();
    for (const [field, label] of DISTRIBUTIONS) {
      let el = box.querySelector(`[data-field="${CSS.escape(field)}"]`);
      if (!el) {
        el = document.createElement("div");
        el.dataset.field = field;
        box.appendChild(el);
      }
      fetch(`/runs/${runId}/distribution.json?field=${field}`, { credentials: "same-origin" })
        .then((r) => r.json())
        .then((d) => { if (d.counts) C.distributionStrip(el, d, label); });
    }
  }

  function addSeries(series, arrived) {
    for (const [name, pts] of Object.entries(series)) {
      if (arrived) for (const [step] of pts) if (!liveTimes.has(step)) liveTimes.set(step, arrived);
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
        times = body.times || { steps: [], epoch: [] };
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
    loadDistributions(true);
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
      if (frame.series) { addSeries(frame.series, Date.now() / 1000); drawMetrics(); }
      if (frame.histogram) { drawHistogram(frame.histogram); loadDistributions(false); }
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
