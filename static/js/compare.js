// Run comparison: one uPlot chart per metric with every run's (server-downsampled) mean overlaid, on the shared
// chart helpers (tick labels that fit the range, integer steps, every run's value on hover, CSV/PNG export).
(function () {
  "use strict";
  const node = document.getElementById("compare-series");
  const box = document.getElementById("compare-charts");
  if (!node || !box) return;
  const C = window.CrucibleCharts;
  C.compared = new Map(); // metric -> uPlot, for the browser tests and the console
  document.querySelectorAll(".swatch").forEach((el) => {
    el.style.cssText = `display:inline-block;width:10px;height:10px;margin-right:6px;background:${C.PALETTE[+el.dataset.index % C.PALETTE.length]}`;
  });
  const series = JSON.parse(node.textContent);
  const groupNode = document.getElementById("compare-groups");
  const groups = groupNode ? JSON.parse(groupNode.textContent) : {};
  const groupBy = (document.getElementById("compare-group-by") || {}).value || "";
  Object.keys(series).forEach((name) => {
    const runs = series[name];
    if (!runs.length) return;
    // Align the runs on the union of their steps (uPlot.join), gaps where a run has no point.
    const joined = uPlot.join(runs.map((l) => [l.steps, l.mean]));
    let lines = runs.map((l, i) => ({ label: "run " + l.run, run: l.run, ys: joined[i + 1], color: C.PALETTE[i % C.PALETTE.length] }));
    if (groupBy) lines = C.groupLines(joined[0], lines, (line) => `${groupBy}=${groups[line.run]}`);
    const holder = document.createElement("div");
    holder.className = "small-chart";
    holder.dataset.metric = name;
    holder.innerHTML = '<div class="chart-tools"><button type="button" data-act="csv">CSV</button>' +
      '<button type="button" data-act="png">PNG</button></div><div class="plot"></div>';
    box.appendChild(holder);
    const chart = C.lineChart(holder.querySelector(".plot"), joined[0], lines, {
      title: name, width: Math.max(260, Math.floor(box.clientWidth / 2) - 12), height: 180, sync: "compare",
    });
    C.compared.set(name, chart);
    holder.querySelector(".chart-tools").addEventListener("click", (evt) => {
      const act = evt.target.dataset && evt.target.dataset.act;
      if (act === "csv") C.exportCsv(`compare-${name}`, chart._crucible.xs, chart._crucible.lines);
      if (act === "png") C.exportPng(`compare-${name}`, chart);
    });
  });
})();
