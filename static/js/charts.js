// Chart helpers shared by the run page and the comparison page (uPlot): tick labels that fit the range, integer
// step axes, hover values, EMA smoothing, log scale, and CSV/PNG export. Exposed as window.CrucibleCharts.
(function (global) {
  "use strict";

  const SI = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
  // Step axes: ticks only on whole steps (uPlot picks the smallest increment that leaves room for the labels).
  const STEP_INCRS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 2500, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5,
    1e6, 2e6, 5e6, 1e7];

  function distinct(labels) { return new Set(labels).size === labels.length; }
  function trimZeros(text) { return text.includes(".") ? text.replace(/0+$/, "").replace(/\.$/, "") : text; }

  // Decimals that write `x` exactly (to 1e-6 of itself): 0.25 -> 2, 2.5 -> 1, 5 -> 0.
  function decimalsOf(x) {
    for (let d = 0; d < 10; d++) {
      const scaled = x * Math.pow(10, d);
      if (Math.abs(scaled - Math.round(scaled)) <= 1e-6 * Math.max(1, Math.abs(scaled))) return d;
    }
    return 10;
  }

  // Tick labels for one axis: SI prefixes from 10^4 up, scientific notation below 10^-2, fixed decimals between,
  // with as many digits as the tick spacing needs (ticks 0, 2.5e-4, 5e-4 read so, never "0, 3e-4, 5e-4"), and more
  // if two labels would still read the same.
  function tickLabels(splits) {
    const finite = splits.filter((v) => v != null && Number.isFinite(v));
    if (!finite.length) return splits.map(() => "");
    const mag = Math.max(...finite.map(Math.abs));
    let step = Infinity;
    for (let i = 1; i < finite.length; i++) {
      const d = Math.abs(finite[i] - finite[i - 1]);
      if (d > 0) step = Math.min(step, d);
    }
    if (!Number.isFinite(step)) step = mag || 1;
    let format;
    if (mag >= 1e4) {
      const [div, sym] = SI.find(([d]) => mag >= d);
      const start = decimalsOf(step / div);
      format = (v, extra) => trimZeros((v / div).toFixed(Math.min(start + extra, 12))) + sym;
    } else if (mag > 0 && mag < 1e-2) {
      const start = decimalsOf(step / Math.pow(10, Math.floor(Math.log10(mag))));
      format = (v, extra) => (v === 0 ? "0" : v.toExponential(Math.min(start + extra, 12)).replace(/\.?0+e/, "e"));
    } else {
      const start = decimalsOf(step);
      format = (v, extra) => v.toFixed(Math.min(start + extra, 12));
    }
    for (let extra = 0; extra < 8; extra++) {
      const labels = finite.map((v) => format(v, extra));
      if (distinct(labels) || extra === 7) {
        return splits.map((v) => (v != null && Number.isFinite(v) ? format(v, extra) : ""));
      }
    }
    return splits.map(String);
  }

  // One value for the hover legend and exports: four significant digits, scientific where that is shorter.
  function formatValue(v) {
    if (v == null || !Number.isFinite(v)) return "–";
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a >= 1e5 || a < 1e-3) return v.toExponential(3).replace(/\.?0+e/, "e");
    return String(Number(v.toPrecision(4)));
  }

  const TIME_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
    172800, 604800];
  // Seconds since the run's first point as 45s, 12m, 3h 05m, 2d 04h.
  function duration(sec) {
    if (sec == null || !Number.isFinite(sec)) return "–";
    const s = Math.round(sec);
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m${s % 60 ? " " + String(s % 60).padStart(2, "0") + "s" : ""}`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
    return `${Math.floor(s / 86400)}d ${String(Math.floor((s % 86400) / 3600)).padStart(2, "0")}h`;
  }

  // Wall time of a step: piecewise-linear between the sampled (step, epoch) pairs of /runs/<id>/chart.json; past
  // the last one, `live` (step -> epoch when its frame arrived); seconds since the first point.
  function stepClock(times, live) {
    const steps = times.steps || [];
    const epoch = times.epoch || [];
    const start = epoch.length ? epoch[0] : null;
    return function (step) {
      if (live && live.has(step)) return start == null ? 0 : live.get(step) - start;
      if (!steps.length) return null;
      if (step <= steps[0]) return 0;
      let lo = 0, hi = steps.length - 1;
      if (step >= steps[hi]) return epoch[hi] - start;
      while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (steps[mid] <= step) lo = mid; else hi = mid; }
      const f = (step - steps[lo]) / (steps[hi] - steps[lo]);
      return epoch[lo] + f * (epoch[hi] - epoch[lo]) - start;
    };
  }

  function stepLabels(splits) {
    return splits.map((v) => (Number.isInteger(v) ? String(v) : ""));
  }

  // TensorBoard's smoothing: an exponential moving average with its start-up bias removed; gaps stay gaps.
  function ema(values, weight) {
    if (!weight) return values.slice();
    const out = [];
    let last = 0;
    let n = 0;
    for (const v of values) {
      if (v == null || !Number.isFinite(v)) { out.push(null); continue; }
      last = last * weight + (1 - weight) * v;
      n += 1;
      out.push(last / (1 - Math.pow(weight, n)));
    }
    return out;
  }

  // The y range of a linear chart. uPlot's tick loop never ends on a range that is flat up to float noise (a
  // weight-sync time or a KL constant to 1e-9: leeoniya/uPlot#1084, "RangeError: Invalid array length"), and an
  // all-zero series would get a 0-100 axis. A range narrower than a millionth of its magnitude is drawn as a band
  // of +-10% around its middle (0..1 for zeros); anything wider gets uPlot's own padded range.
  function yRange(u, min, max) {
    if (min == null || max == null || !Number.isFinite(min) || !Number.isFinite(max)) return [0, 1];
    const mag = Math.max(Math.abs(min), Math.abs(max));
    if (max - min <= mag * 1e-6) {
      if (mag === 0) return [0, 1];
      const mid = (min + max) / 2;
      const pad = mag * 0.1;
      return [mid - pad, mid + pad];
    }
    return uPlot.rangeNum(min, max, 0.1, true);
  }

  function positive(data) {
    return data.slice(1).every((ys) => ys.every((v) => v == null || v > 0));
  }

  // A chart of one or more lines against step: `lines` = [{label, ys, color}], `xs` the shared steps. With
  // smoothing, each line is drawn smoothed over its raw values (faint). Options: title, width, height, log,
  // smoothing (0..0.99), sync (a cursor sync key: hovering one chart shows the values on all of them).
  function chartData(xs, lines, smoothing) {
    const data = [xs];
    for (const line of lines) {
      if (smoothing > 0) data.push(line.ys);
      data.push(smoothing > 0 ? ema(line.ys, smoothing) : line.ys);
      if (line.band) data.push(line.band[0], line.band[1]);
    }
    return data;
  }

  function lineChart(el, xs, lines, opts) {
    const smoothing = opts.smoothing || 0;
    const time = opts.xMode === "time";
    const bands = [];
    const series = [time
      ? { label: "wall time", value: (u, v) => duration(v) }
      : { label: "step", value: (u, v) => (v == null ? "–" : String(v)) }];
    lines.forEach((line, i) => {
      const color = line.color || PALETTE[i % PALETTE.length];
      if (smoothing > 0) {
        series.push({ label: `${line.label} (raw)`, stroke: color + "40", width: 1, spanGaps: true,
          value: (u, v) => formatValue(v), points: { show: false } });
      }
      series.push({ label: line.label, stroke: color, width: 1.5, spanGaps: true, value: (u, v) => formatValue(v) });
      if (line.band) {  // a group's min and max around its mean (W&B's grouped runs)
        const edge = { stroke: color + "00", width: 0, spanGaps: true, points: { show: false }, value: (u, v) => formatValue(v) };
        series.push({ ...edge, label: `${line.label} min` }, { ...edge, label: `${line.label} max` });
        bands.push({ series: [series.length - 1, series.length - 2], fill: color + "26" });
      }
    });
    const data = chartData(xs, lines, smoothing);
    const log = !!opts.log && positive(data);
    const chart = new uPlot({
      title: opts.title, width: opts.width, height: opts.height || 180,
      scales: { x: { time: false }, y: log ? { distr: 3 } : { distr: 1, range: yRange } },
      legend: { show: true, live: true },
      cursor: opts.sync ? { sync: { key: opts.sync } } : {},
      axes: [
        time
          ? { size: 30, incrs: TIME_INCRS, values: (u, splits) => splits.map(duration) }
          : { size: 30, incrs: STEP_INCRS, values: (u, splits) => stepLabels(splits) },
        { size: 64, values: (u, splits) => tickLabels(splits) },
      ],
      series: series,
      bands: bands,
    }, data, el);
    chart._crucible = { xs: xs, lines: lines, log: log };
    return chart;
  }

  function download(name, href) {
    const a = document.createElement("a");
    a.href = href;
    a.download = name;
    document.body.appendChild(a);
    a.click();
    a.remove();
  }

  function csvOf(xs, lines) {
    const head = ["step"].concat(lines.map((l) => JSON.stringify(l.label)));
    const rows = xs.map((x, i) => [x].concat(lines.map((l) => (l.ys[i] == null ? "" : l.ys[i]))).join(","));
    return head.join(",") + "\n" + rows.join("\n") + "\n";
  }

  function exportCsv(name, xs, lines) {
    const url = URL.createObjectURL(new Blob([csvOf(xs, lines)], { type: "text/csv" }));
    download(`${name.replace(/[^\w.-]+/g, "_")}.csv`, url);
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  function exportPng(name, chart) {
    download(`${name.replace(/[^\w.-]+/g, "_")}.png`, chart.ctx.canvas.toDataURL("image/png"));
  }

  // W&B's distribution chart as a heat-map strip: one column per group of steps, one row per bin (high values on
  // top), shade = the column's share in that bin. `d` is /runs/<id>/distribution.json. Hover names the cell.
  function distributionStrip(el, d, label) {
    el.textContent = "";
    if (!d.counts.length) { el.textContent = `No ${label} yet.`; return null; }
    const width = Math.max(300, el.clientWidth - 70);
    const height = 110;
    const wrap = document.createElement("div");
    wrap.className = "dist-strip";
    const axis = document.createElement("div");
    axis.className = "dist-axis";
    const hi = d.edges[d.edges.length - 1];
    const lo = d.edges[0];
    axis.innerHTML = `<span>${formatValue(hi)}</span><span>${formatValue(lo)}</span>`;
    const canvas = document.createElement("canvas");
    canvas.width = width;
    canvas.height = height;
    canvas.dataset.columns = String(d.counts.length);
    const ctx = canvas.getContext("2d");
    const cols = d.counts.length;
    const bins = d.counts[0].length;
    const cw = width / cols;
    const rh = height / bins;
    d.counts.forEach((column, i) => {
      const top = Math.max(...column) || 1;
      column.forEach((n, b) => {
        if (!n) return;
        ctx.fillStyle = `rgba(37,99,235,${(0.15 + 0.85 * n / top).toFixed(3)})`;
        ctx.fillRect(i * cw, height - (b + 1) * rh, Math.ceil(cw), Math.ceil(rh));
      });
    });
    const steps = document.createElement("div");
    steps.className = "dist-steps muted";
    steps.innerHTML = `<span>step ${d.columns[0][0]}</span><span>${label}</span><span>step ${d.columns[cols - 1][1]}</span>`;
    const hover = document.createElement("div");
    hover.className = "dist-hover muted";
    hover.textContent = "Hover for counts.";
    canvas.addEventListener("mousemove", (evt) => {
      const r = canvas.getBoundingClientRect();
      const i = Math.min(cols - 1, Math.floor((evt.clientX - r.left) / r.width * cols));
      const b = Math.min(bins - 1, Math.floor((r.bottom - evt.clientY) / r.height * bins));
      const [s0, s1] = d.columns[i];
      const edgeLo = d.edges[b], edgeHi = d.edges[Math.min(b + 1, d.edges.length - 1)];
      const total = d.counts[i].reduce((a, n) => a + n, 0);
      hover.textContent = `steps ${s0 === s1 ? s0 : s0 + "–" + s1}, ${label} ${formatValue(edgeLo)} to ${formatValue(edgeHi)}: ` +
        `${d.counts[i][b]} of ${total} trajectories`;
    });
    const body = document.createElement("div");
    body.className = "dist-body";
    body.appendChild(axis);
    body.appendChild(canvas);
    wrap.appendChild(body);
    wrap.appendChild(steps);
    wrap.appendChild(hover);
    el.appendChild(wrap);
    return canvas;
  }

  // Lines aligned on the same xs, grouped by `keyOf(line)`: per group and x the mean over the lines that have a
  // point there, and the min and max as a band.
  function groupLines(xs, lines, keyOf) {
    const groups = new Map();
    for (const line of lines) {
      const key = keyOf(line);
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(line);
    }
    return Array.from(groups, ([key, members], i) => {
      const mean = [], lo = [], hi = [];
      xs.forEach((_, j) => {
        const vals = members.map((m) => m.ys[j]).filter((v) => v != null && Number.isFinite(v));
        mean.push(vals.length ? vals.reduce((a, v) => a + v, 0) / vals.length : null);
        lo.push(vals.length ? Math.min(...vals) : null);
        hi.push(vals.length ? Math.max(...vals) : null);
      });
      return { label: `${key} (${members.length} run${members.length === 1 ? "" : "s"})`, ys: mean, band: [lo, hi],
        color: PALETTE[i % PALETTE.length] };
    });
  }

  global.CrucibleCharts = {
    groupLines, distributionStrip, duration, stepClock,
    tickLabels, formatValue, stepLabels, yRange, ema, chartData, lineChart, positive, csvOf, exportCsv, exportPng, PALETTE,
  };
})(window);
