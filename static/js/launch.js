// The training launch form offers only the reward configs that fit the chosen environment (each option lists the
// environments it can score in data-envs, computed by the server from the terms' inputs and what each environment
// produces); a reward that stops fitting is replaced by the first one that does.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", () => {
    const env = document.querySelector('select[name="environment"]');
    const reward = document.querySelector('select[name="reward_version"]');
    const note = document.getElementById("reward-fit");
    if (!env || !reward) return;
    function fits(option) { return (option.dataset.envs || "").split(" ").includes(env.value); }
    function apply() {
      let firstFit = null;
      for (const option of reward.options) {
        const ok = fits(option);
        option.hidden = !ok;
        option.disabled = !ok;
        if (ok && firstFit === null) firstFit = option;
      }
      const chosen = reward.options[reward.selectedIndex];
      if ((!chosen || !fits(chosen)) && firstFit) firstFit.selected = true;
      if (note) {
        note.textContent = firstFit
          ? `Only the reward configs whose terms environment "${env.value}" can feed are offered.`
          : `No reward config fits environment "${env.value}": add one under Reward configs.`;
      }
    }
    env.addEventListener("change", apply);
    apply();
  });
})();
