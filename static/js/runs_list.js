// The runs list refreshes itself every 5 s (htmx swaps the table): the runs ticked for "Compare selected" stay
// ticked across those swaps.
(function () {
  "use strict";
  let ticked = new Set();
  document.addEventListener("change", (evt) => {
    const box = evt.target;
    if (box.matches && box.matches('#runs-grid input[name="run"]')) {
      if (box.checked) ticked.add(box.value); else ticked.delete(box.value);
    }
  });
  document.addEventListener("htmx:afterSwap", (evt) => {
    if (!evt.detail.target || evt.detail.target.id !== "runs-table") return;
    document.querySelectorAll('#runs-grid input[name="run"]').forEach((box) => { box.checked = ticked.has(box.value); });
  });
})();
