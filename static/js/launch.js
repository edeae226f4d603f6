// The training launch form offers only the reward configs that fit the chosen environment (each option lists the
// environments it can score in data-envs, computed by the server from the terms' inputs and what each environment
// produces); a reward that stops fitting is replaced by the first one that does.
(function () {
  "use strict";
  // The run time before launching: steps x prompts x group x max_new_tokens sampled-token slots, times the
  // seconds per slot of this base model (this installation's finished runs, else the trainer benchmark's figure).
  function estimate() {
    const out = document.getElementById("run-estimate");
    const node = document.getElementById("run-time-rates");
    if (!out || !node) return;
    const rates = JSON.parse(node.textContent);
    const value = (name) => Number((document.querySelector(`[name="${name}"]`) || {}).value || NaN);
    const model = (document.querySelector('[name="base_model"]') || {}).value;
    const rate = rates[model];
    // An empty group size is the environment's recipe value (search: Context-1's 8), else the trainer's 4.
    const sizes = JSON.parse((document.getElementById("recipe-group-sizes") || {}).textContent || "{}");
    const env = (document.querySelector('[name="environment"]') || {}).value;
    const typed = (document.querySelector('[name="group_size"]') || {}).value;
    const group = typed ? Number(typed) : (sizes[env] || sizes.fallback || 4);
    // An empty per-turn cap is likewise the environment's (search: 256), else the trainer's 64.
    const caps = JSON.parse((document.getElementById("recipe-token-caps") || {}).textContent || "{}");
    const typedCap = (document.querySelector('[name="sampling.max_new_tokens"]') || {}).value;
    const cap = typedCap ? Number(typedCap) : (caps[env] || caps.fallback || 64);
    const slots = value("steps") * value("prompts_per_step") * group * cap;
    if (!rate || !Number.isFinite(slots) || slots <= 0) {
      out.textContent = rate ? "" : `No run-time estimate for ${model} yet: it appears after its first finished run here.`;
      return;
    }
    const minutes = slots * rate.seconds_per_slot / 60;
    const text = minutes < 1 ? "under a minute" : minutes < 90 ? `about ${Math.round(minutes)} min` : `about ${(minutes / 60).toFixed(1)} h`;
    out.textContent = `Estimated run time: ${text} of training (${slots.toLocaleString()} sampled-token slots; rate from ${rate.source}). Queueing, model loading and evals come on top.`;
  }

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
    // Datasets: only those the environment trains on (each option's data-envs, from Environment.dataset_kind).
    const dataset = document.querySelector('select[name="dataset_version"]');
    const datasetNote = document.getElementById("dataset-fit");
    function applyDatasets() {
      if (!dataset) return;
      let firstFit = null;
      for (const option of dataset.options) {
        if (!option.value) continue;
        const ok = fits(option);
        option.hidden = !ok;
        option.disabled = !ok;
        if (ok && firstFit === null) firstFit = option;
      }
      const chosen = dataset.options[dataset.selectedIndex];
      if ((!chosen || !fits(chosen)) && firstFit) firstFit.selected = true;
      if (datasetNote) {
        datasetNote.textContent = firstFit
          ? `Only the datasets environment "${env.value}" trains on are offered.`
          : `No dataset fits environment "${env.value}": upload or generate one under Datasets.`;
      }
    }
    // Recipes: choosing one sets its values under Advanced (the server rendered the default recipe's already).
    const recipe = document.getElementById("recipe");
    const presets = JSON.parse((document.getElementById("recipe-presets") || {}).textContent || "[]");
    function applyRecipe() {
      const chosen = presets.find((r) => r.name === recipe.value);
      if (!chosen) return;
      for (const [name, value] of Object.entries(chosen.settings)) {
        const field = document.querySelector(`[name="${name}"]`);
        if (field) field.value = value;
      }
      estimate();
    }
    if (recipe) {
      recipe.addEventListener("change", applyRecipe);
      // Editing a value a recipe sets makes the choice custom: what is launched is what the form shows.
      const keys = new Set(presets.flatMap((r) => Object.keys(r.settings)));
      document.querySelector("form").addEventListener("input", (event) => {
        if (keys.has(event.target.name)) recipe.value = "custom";
      });
    }
    env.addEventListener("change", () => { apply(); applyDatasets(); });
    apply();
    applyDatasets();
    estimate();
    document.querySelector("form").addEventListener("input", estimate);
    document.querySelector("form").addEventListener("change", estimate);
  });
})();
