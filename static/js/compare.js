// Run comparison: one uPlot chart per metric with every run's (server-downsampled) mean overlaid.
(function () {
  "use strict";
  const node = document.getElementById("compare-series");
  const box = document.getElementById("compare-charts");
  if (!node || !box) return;
  const palette = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];
  document.querySelectorAll(".swatch").forEach((el) => {
    el.style.cssText = `display:inline-block;width:10px;height:10px;margin-right:6px;background:${palette[+el.dataset.index % palette.length]}`;
  });
  const series = JSON.parse(node.textContent);
  Object.keys(series).forEach((name) => {
    const lines = series[name];
    if (!lines.length) return;
    // Align the runs on the union of their steps (uPlot.join), gaps where a run has no point.
    const data = uPlot.join(lines.map((l) => [l.steps, l.mean]));
    const el = document.createElement("div");
    el.className = "small-chart";
    el.dataset.metric = name;
    box.appendChild(el);
    new uPlot({
      title: name, width: Math.max(260, Math.floor(box.clientWidth / 2) - 12), height: 180,
      scales: { x: { time: false } },
      series: [{ label: "step" }].concat(lines.map((l, i) => ({
        label: "run " + l.run, stroke: palette[i % palette.length], width: 1.5, spanGaps: true,
      }))),
    }, data, el);
  });
})();
