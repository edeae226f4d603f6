// The review page: keyboard shortcuts (1 confirmed hack, 2 false positive, 3 unclear, n next item, / the note)
// and, once the trajectory view is loaded into the page, the flagged turn outlined and its evidence span marked.
(function () {
  const root = document.getElementById("review-root");
  if (!root) return;

  function typing(target) {
    return target && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName));
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (typing(event.target)) {
      if (event.key === "Escape") event.target.blur();
      return;
    }
    const form = document.getElementById("label-form");
    if (event.key === "/") {
      const note = document.getElementById("note");
      if (note) {
        event.preventDefault();
        note.focus();
      }
    } else if (["1", "2", "3"].includes(event.key) && form) {
      const button = form.querySelector('button[data-key="' + event.key + '"]');
      if (button) {
        event.preventDefault();
        // A click, not form.requestSubmit(button): htmx includes the pressed button's name/value (the label)
        // only for a button it saw clicked.
        button.click();
      }
    } else if (event.key === "n") {
      const next = document.getElementById("next-form");
      if (next) {
        event.preventDefault();
        next.requestSubmit();
      }
    }
  });

  function markFlaggedTurn() {
    const index = parseInt(root.dataset.flaggedTurn, 10);
    if (Number.isNaN(index)) return;
    const turn = document.querySelectorAll("#trajectory-embed #turns .turn")[index];
    if (!turn) return;
    turn.classList.add("flagged");
    turn.id = "flagged-turn";
    const details = turn.querySelector("details");
    if (details) details.open = true;
    const pre = turn.querySelector("pre");
    const span = (root.dataset.span || "").split(",").map(Number);
    if (!pre || span.length !== 2 || span.some(Number.isNaN)) return;
    const text = pre.textContent;
    const [start, end] = span;
    if (start < 0 || end > text.length || start > end) return;
    const mark = document.createElement("mark");
    mark.className = "evidence";
    mark.textContent = text.slice(start, end);
    pre.replaceChildren(document.createTextNode(text.slice(0, start)), mark, document.createTextNode(text.slice(end)));
  }

  document.body.addEventListener("htmx:afterSettle", function (event) {
    if (event.target && event.target.id === "trajectory-embed") markFlaggedTurn();
  });
})();
