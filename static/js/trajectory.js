// The trajectory page's token-usage curve: tokens in the model's view after each turn, against the budget.
(function () {
  const data = document.getElementById("usage-data");
  const target = document.getElementById("usage-chart");
  if (!data || !target || typeof uPlot === "undefined") return;
  const usage = JSON.parse(data.textContent);
  const budgetEl = document.getElementById("usage-budget");
  const budget = budgetEl ? JSON.parse(budgetEl.textContent) : null;
  const turns = usage.map((_, i) => i);
  const series = [{ label: "turn" }, { label: "tokens in view", stroke: "#2563eb", width: 2 }];
  const columns = [turns, usage];
  if (budget) {
    series.push({ label: "budget", stroke: "#dc2626", dash: [4, 4] });
    columns.push(turns.map(() => budget));
  }
  new uPlot({ width: Math.max(target.clientWidth, 320), height: 220, scales: { x: { time: false } }, series }, columns, target);
})();
