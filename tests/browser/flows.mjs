// Browser flows against a live Crucible (tests/test_browser.py starts the stack and runs this file).
// playwright-core drives Debian's chromium; every step asserts, and any console error or page error fails the run.
// Usage: CRUCIBLE_URL=http://127.0.0.1:8000 CRUCIBLE_USER=operator CRUCIBLE_PASSWORD=... node flows.mjs <flow>
import { chromium } from "playwright-core";

const base = process.env.CRUCIBLE_URL;
const flow = process.argv[2] || "launch";
const problems = [];
const steps = [];

// With CRUCIBLE_SCREENSHOTS=<folder>, the charts flow saves the README's screenshots there.
async function shot(page, name) {
  if (!process.env.CRUCIBLE_SCREENSHOTS) return;
  await page.screenshot({ path: `${process.env.CRUCIBLE_SCREENSHOTS}/${name}.png`, fullPage: false });
  steps.push(`screenshot ${name}`);
}

function check(condition, message) {
  if (!condition) throw new Error(message);
  steps.push(message);
}

async function login(page, user, password) {
  await page.goto(`${base}/accounts/login/`);
  await page.fill('input[name="username"]', user);
  await page.fill('input[name="password"]', password);
  await Promise.all([page.waitForNavigation(), page.click('button[type="submit"]')]);
  check((await page.content()).includes("Log out"), `logged in as ${user}`);
}

// Log in, launch a re-scoring job from its page, and watch the run page update over the websocket.
async function launch(page) {
  await login(page, process.env.CRUCIBLE_USER, process.env.CRUCIBLE_PASSWORD);
  await page.goto(`${base}/runs/new/rescore/`);
  // The header's "Log out" is a submit button too: press the form's own.
  await Promise.all([page.waitForNavigation(), page.click('main form button[type="submit"]')]);
  check(/\/runs\/\d+\/$/.test(page.url()), `launched: ${page.url()}`);
  await page.waitForFunction(() => document.getElementById("ws-state")?.textContent.includes("live"), null, {
    timeout: 30000,
  });
  steps.push("websocket connected");
  // A chart canvas appears and the progress counter moves without a reload.
  await page.waitForSelector("#chart-metrics canvas", { timeout: 120000 });
  steps.push("metric chart drawn from websocket frames");
  await page.waitForFunction(() => document.querySelector("#run-progress span")?.textContent.match(/^(\d+) \/ \1$/) && !document.querySelector("#run-progress span").textContent.startsWith("0 /"), null, { timeout: 120000 });
  steps.push(`progress reached ${await page.textContent("#run-progress span")}`);
  await page.waitForSelector(".badge.succeeded", { timeout: 60000 });
  steps.push("status badge turned succeeded");
}

// A reviewer works a queue with the keyboard: claim an item, see the detector's evidence highlighted, press 2
// (false positive) and land on the next item, press 1 (confirmed hack) and get the flow-back actions.
async function review(page) {
  await login(page, process.env.CRUCIBLE_USER, process.env.CRUCIBLE_PASSWORD);
  await page.goto(`${base}${process.env.CRUCIBLE_REVIEW_URL}`);
  await Promise.all([page.waitForNavigation(), page.click('main form button:has-text("Review next")')]);
  check(/\/review\/items\/\d+\/$/.test(page.url()), `claimed an item: ${page.url()}`);
  const first = page.url();
  await page.waitForSelector("#evidence mark.evidence", { timeout: 30000 });
  steps.push("detector evidence highlighted");
  await page.keyboard.press("2");
  await page.waitForFunction((url) => location.href !== url || document.querySelector("#label-result .errors"), first, {
    timeout: 30000,
  });
  const refused = await page.locator("#label-result .errors").count();
  if (refused) throw new Error(`label refused: ${await page.textContent("#label-result")}`);
  check(/\/review\/items\/\d+\/$/.test(page.url()), `2 labelled it a false positive and opened the next item: ${page.url()}`);
  await page.waitForSelector("#evidence mark.evidence", { timeout: 30000 });
  await page.keyboard.press("1");
  await page.waitForSelector("#label-result .ok", { timeout: 30000 });
  check((await page.textContent("#label-result")).includes("confirmed hack"), "1 labelled it a confirmed hack");
}

// A run's charts read like W&B's: tick labels of values below 0.01 are distinct and non-zero, step axes show
// integers, hovering shows values, charts sit in groups by prefix (key ones first) that fold, the filter, smoothing
// and log scale change what is drawn; the comparison page overlays two runs.
async function charts(page) {
  await login(page, process.env.CRUCIBLE_USER, process.env.CRUCIBLE_PASSWORD);
  const [first, second] = process.env.CRUCIBLE_RUNS.split(",");
  await page.goto(`${base}/runs/${first}/`);
  await page.waitForSelector('.small-chart[data-metric="loss"] canvas', { timeout: 30000 });
  const axes = await page.evaluate(() => {
    const c = window.CrucibleCharts.live.get("loss");
    return { y: c.axes[1]._values.filter((v) => v), x: c.axes[0]._values.filter((v) => v) };
  });
  check(axes.y.length >= 2 && new Set(axes.y).size === axes.y.length && !axes.y.some((v) => /^-?0(\.0*)?$/.test(v)),
    `small values get distinct, non-zero tick labels: ${axes.y.join(" ")}`);
  check(axes.x.length >= 2 && axes.x.every((v) => /^\d+$/.test(v)), `the step axis shows integers: ${axes.x.join(" ")}`);
  for (const [metric, top] of [["weight_sync_seconds", 1.1], ["train/clip_fraction", 1]]) {
    // Outside the pinned section: drawn in a section that starts folded.
    await page.waitForSelector(`.small-chart[data-metric="${metric}"] canvas`, { state: "attached", timeout: 30000 });
    const flat = await page.evaluate((m) => {
      const c = window.CrucibleCharts.live.get(m);
      return { labels: c.axes[1]._values.filter((v) => v), max: c.scales.y.max };
    }, metric);
    check(flat.labels.length >= 2 && new Set(flat.labels).size === flat.labels.length && Math.abs(flat.max - top) < 1e-6,
      `a flat ${metric} gets a readable axis up to ${top}: ${flat.labels.join(" ")} (max ${flat.max})`);
  }
  await page.waitForSelector('#chart-distributions [data-field="reward"] canvas', { timeout: 30000 });
  const columns = await page.$eval('#chart-distributions [data-field="reward"] canvas', (c) => Number(c.dataset.columns));
  check(columns === 40, `the reward distribution over steps has a column per step: ${columns}`);
  const strip = await page.$('#chart-distributions [data-field="reward"] canvas');
  await strip.scrollIntoViewIfNeeded();
  const sb = await strip.boundingBox();
  await page.mouse.move(sb.x + sb.width - 3, sb.y + 3);
  const said = await page.textContent('#chart-distributions [data-field="reward"] .dist-hover');
  check(/steps? 40/.test(said) && /of 4 trajectories/.test(said), `hovering a cell names it: ${said}`);
  await page.waitForSelector('#chart-distributions [data-field="completion_tokens"] canvas', { timeout: 30000 });
  steps.push("sampled tokens over steps drawn");
  await page.$eval("#chart-metrics", (el) => el.scrollIntoView());
  await shot(page, "run-charts");
  const groups = await page.$$eval("#chart-metrics .chart-group", (gs) => gs.map((g) => g.dataset.group));
  check(groups[0] === "key" && groups.includes("env") && groups.includes("reward"), `grouped by prefix: ${groups.join(", ")}`);
  check(groups.includes("mismatch"), `the train-inference mismatch figures have their group: ${groups.join(", ")}`);
  const health = (await page.textContent("#health-status")).trim();
  const gap = await page.textContent('#run-health tr[data-signal="mismatch"]');
  const trend = (await page.textContent("#health-trend")).trim();
  check(health === "bad" && /bad/.test(gap) && trend === "reward improving",
    `the health panel names the mismatch and the learning trend: ${health}; ${gap.replace(/\s+/g, " ")}; ${trend}`);
  const inKey = await page.$$eval('.chart-group[data-group="key"] .small-chart', (cs) => cs.map((c) => c.dataset.metric));
  check(inKey[0] === "reward_mean" && inKey.includes("loss"), `key charts pinned first: ${inKey.join(", ")}`);
  const over = await page.$('.small-chart[data-metric="loss"] .u-over');
  await over.scrollIntoViewIfNeeded();
  const boxOver = await over.boundingBox();
  await page.mouse.move(boxOver.x + boxOver.width / 3, boxOver.y + boxOver.height / 2);
  await page.mouse.move(boxOver.x + boxOver.width / 2, boxOver.y + boxOver.height / 2, { steps: 5 });
  const values = (metric) => page.$$eval(`.small-chart[data-metric="${metric}"] .u-legend .u-value`, (vs) => vs.map((v) => v.textContent));
  await page.waitForFunction(() => {
    const v = document.querySelectorAll('.small-chart[data-metric="loss"] .u-legend .u-value');
    return v.length && Array.from(v).every((e) => e.textContent && e.textContent !== "–");
  }, null, { timeout: 5000 });
  const own = await values("loss");
  check(own.every((v) => v && v !== "–"), `hovering shows the step and value: ${own.join(" ")}`);
  const other = await values("kl");
  check(other.every((v) => v && v !== "–"), `and the other charts' values at that step: ${other.join(" ")}`);
  await page.fill("#chart-filter", "env/");
  const shown = await page.$$eval(".small-chart", (cs) => cs.filter((c) => c.style.display !== "none").map((c) => c.dataset.metric));
  check(shown.length === 1 && shown[0] === "env/turns", `the filter leaves the matching chart: ${shown.join(", ")}`);
  await page.fill("#chart-filter", "");
  check(!(await page.$eval('.chart-group[data-group="env"]', (g) => g.open)), "sections other than the pinned one start folded");
  await page.click('.chart-group[data-group="env"] > summary');
  check(await page.$eval('.chart-group[data-group="env"]', (g) => g.open), "a folded section opens");
  await page.$eval("#chart-smoothing", (el) => { el.value = "0.8"; el.dispatchEvent(new Event("input")); });
  const smoothed = await page.evaluate(() => {
    const c = window.CrucibleCharts.live.get("loss");
    return { series: c.series.length, raw: c.data[1].slice(0, 3), smooth: c.data[2].slice(0, 3) };
  });
  check(smoothed.series === 3 && smoothed.smooth[2] !== smoothed.raw[2], `smoothing draws an EMA over the faint raw series`);
  await page.click('.small-chart[data-metric="loss"] [data-act="log"]');
  check(await page.evaluate(() => window.CrucibleCharts.live.get("loss").scales.y.distr === 3), "log scale switches the y-axis");
  await page.selectOption("#chart-x", "time");
  const timeAxis = await page.evaluate(() => {
    const c = window.CrucibleCharts.live.get("loss");
    return { labels: c.axes[0]._values.filter((v) => v), x: c.series[0].label, last: c.data[0][c.data[0].length - 1] };
  });
  check(timeAxis.x === "wall time" && timeAxis.labels.every((v) => /^\d+(s|m|h|d)/.test(v)) && Math.round(timeAxis.last) === 39 * 30,
    `the x-axis switches to wall time: ${timeAxis.labels.join(" ")}`);
  await page.selectOption("#chart-x", "step");
  // A run page you arrange (issue 39): pin a panel, move it first, hide another; the layout is the user's, on the server.
  await page.click('.chart-group[data-group="reward"] > summary');
  await page.click('.small-chart[data-metric="reward/f_beta"] [data-act="pin"]');
  await page.waitForSelector('.chart-group[data-group="key"] .small-chart[data-metric="reward/f_beta"]');
  for (let i = 0; i < 6; i++) {
    const first = await page.$eval('.chart-group[data-group="key"] .small-chart', (c) => c.dataset.metric);
    if (first === "reward/f_beta") break;
    await page.click('.chart-group[data-group="key"] .small-chart[data-metric="reward/f_beta"] [data-act="left"]');
  }
  const savedAll = page.waitForResponse((r) => r.url().endsWith("/layout/") && r.ok() &&
    (r.request().postData() || "").includes('"hidden":["kl"]') && (r.request().postData() || "").includes('"pinned":["reward/f_beta"'));
  await page.click('.small-chart[data-metric="kl"] [data-act="hide"]');
  await page.waitForSelector('#chart-hidden button[data-show="kl"]');
  await savedAll; // the save is debounced: wait for the one that holds every change
  await page.reload();
  await page.waitForSelector('.small-chart[data-metric="loss"] canvas', { timeout: 30000 });
  const kept = await page.evaluate(() => ({
    log: window.CrucibleCharts.live.get("loss").scales.y.distr, smoothing: document.getElementById("chart-smoothing").value,
    opened: document.querySelector('.chart-group[data-group="env"]').open,
    pinned: Array.from(document.querySelectorAll('.chart-group[data-group="key"] .small-chart')).map((c) => c.dataset.metric),
    hidden: !document.querySelector('.small-chart[data-metric="kl"]') && !!document.querySelector('#chart-hidden button[data-show="kl"]'),
  }));
  check(kept.log === 3 && kept.smoothing === "0.8" && kept.opened, "the layout is remembered across a reload");
  check(kept.pinned[0] === "reward/f_beta" && kept.hidden, `a pinned panel stays pinned and first, a hidden one hidden: ${kept.pinned.join(", ")}`);
  // The runs list: a column from the config, tick the two runs, compare them (the ticks survive the 5 s refresh).
  await page.goto(`${base}/?cols=config.algorithm&q=browser-charts`);
  await shot(page, "runs-table");
  check(await page.isVisible('#runs-grid th:has-text("config.algorithm")'), "a config column in the runs table");
  check((await page.$$eval("#runs-grid tbody tr td", (ts) => ts.map((t) => t.textContent.trim()))).includes("grpo"), "with the runs' values");
  await page.check(`#runs-grid input[value="${first}"]`);
  await page.check(`#runs-grid input[value="${second}"]`);
  await page.waitForTimeout(5600);
  check(await page.isChecked(`#runs-grid input[value="${first}"]`), "ticks survive the table's refresh");
  await Promise.all([page.waitForNavigation(), page.click('#runs-compare button[type="submit"]')]);
  check(page.url().includes(`run=${first}`) && page.url().includes(`run=${second}`), `compare selected: ${page.url()}`);
  await page.waitForSelector('#compare-charts .small-chart[data-metric="loss"] canvas', { timeout: 30000 });
  await page.$eval("#compare-charts", (el) => el.scrollIntoView());
  await shot(page, "compare");
  await page.waitForSelector('#compare-charts .small-chart[data-metric="loss"] canvas', { timeout: 30000 });
  const labels = await page.$$eval('#compare-charts .small-chart[data-metric="loss"] .u-legend .u-series th', (ts) => ts.map((t) => t.textContent));
  check(labels.filter((t) => t.includes("run ")).length === 2, `two runs overlaid: ${labels.join(" | ")}`);
  // Grouped by a config key: one line per value, the group's mean, with its min and max as a band.
  await page.goto(`${base}/runs/compare/?run=${first}&run=${second}&group=config.algorithm`);
  await page.waitForSelector('#compare-charts .small-chart[data-metric="loss"] canvas', { timeout: 30000 });
  const grouped = await page.evaluate(() => {
    const c = window.CrucibleCharts.compared.get("loss");
    return { labels: c.series.map((s) => s.label), bands: (c.bands || []).length, mean: c.data[1][0], lo: c.data[2][0], hi: c.data[3][0] };
  });
  check(grouped.labels[1] === "config.algorithm=grpo (2 runs)" && grouped.bands === 1 && grouped.lo < grouped.mean && grouped.mean < grouped.hi,
    `grouped by config.algorithm: mean with a min/max band (${grouped.lo.toFixed(4)} < ${grouped.mean.toFixed(4)} < ${grouped.hi.toFixed(4)})`);
  // The launch form offers only the rewards that fit the chosen environment.
  await page.goto(`${base}/runs/new/train/`);
  await page.selectOption('select[name="environment"]', "exact_answer");
  const offered = await page.$$eval('select[name="reward_version"] option', (os) => os.filter((o) => !o.disabled).map((o) => o.textContent));
  check(offered.length > 0 && offered.every((t) => !t.includes("browser-ctx1")), `for exact_answer the Context-1 reward is not offered: ${offered.join(" | ")}`);
  await page.selectOption('select[name="environment"]', "search");
  const forSearch = await page.$$eval('select[name="reward_version"] option', (os) => os.filter((o) => !o.disabled).map((o) => o.textContent));
  check(forSearch.some((t) => t.includes("browser-ctx1")), "for search it is");
  await page.fill('input[name="base_model"]', "smollm2-135m-instruct");  // a text box offering the known models
  await page.fill('input[name="steps"]', "40");
  const estimate = await page.textContent("#run-estimate");
  // search's empty per-turn cap is its recipe's 256 tokens, so the estimate may run to hours
  check(/^Estimated run time: about [\d.]+ (min|h) /.test(estimate), `the run time is estimated before launching: ${estimate}`);
}

// Every page the header links to, the API docs and the launch forms, open without a console error or a failed
// request (the favicon included).
async function pages(page) {
  await login(page, process.env.CRUCIBLE_USER, process.env.CRUCIBLE_PASSWORD);
  const failed = [];
  page.on("response", (r) => { if (r.status() >= 400) failed.push(`${r.status()} ${r.url()}`); });
  page.on("requestfailed", (r) => failed.push(`${r.failure()?.errorText} ${r.url()}`));
  const links = await page.$$eval("header.top nav a", (as) => as.map((a) => a.getAttribute("href")));
  const extra = ["/runs/new/train/", "/runs/new/sft/", "/runs/new/rescore/", "/runs/compare/", "/api/v1/docs/"];
  for (const href of [...new Set([...links, ...extra])]) {
    await page.goto(`${base}${href}`);
    await page.waitForLoadState("networkidle");
    steps.push(`opened ${href}`);
  }
  check(links.length >= 8, `the header links ${links.length} pages`);
  check(failed.length === 0, `no request failed: ${failed.join(", ")}`);
}

// A real training run (the end-to-end test's async run with partial rollouts on Ray): its page shows the health
// panel with the weight-sync and stall rows, the train-inference mismatch charts and the token-version histogram
// (versions/lag_<k>_share per step); the run list shows its health badge.
async function realrun(page) {
  await login(page, process.env.CRUCIBLE_USER, process.env.CRUCIBLE_PASSWORD);
  const run = process.env.CRUCIBLE_RUN;
  await page.goto(`${base}/runs/${run}/`);
  await page.waitForSelector('.small-chart[data-metric="versions/lag_1_share"] canvas', { state: "attached", timeout: 30000 });
  const groups = await page.$$eval("#chart-metrics .chart-group", (gs) => gs.map((g) => g.dataset.group));
  check(groups.includes("mismatch") && groups.includes("versions"), `mismatch and token-version groups: ${groups.join(", ")}`);
  const lags = await page.$$eval('.chart-group[data-group="versions"] .small-chart', (cs) => cs.map((c) => c.dataset.metric));
  check(lags.includes("versions/lag_0_share") && lags.includes("versions/lag_1_share"), `the token-version histogram: ${lags.join(", ")}`);
  const kl = await page.evaluate(() => window.CrucibleCharts.live.get("mismatch/kl_k3").data[1].length);
  check(kl === 3, `the mismatch KL has a point per step: ${kl}`);
  await page.$eval("#chart-metrics", (el) => el.scrollIntoView());
  await shot(page, "real-run-charts");
  const rows = await page.$$eval("#run-health tr[data-signal]", (rs) => rs.map((r) => r.dataset.signal));
  check(["mismatch", "staleness", "weight_sync", "stall", "trend"].every((k) => rows.includes(k)), `health rows: ${rows.join(", ")}`);
  const sync = await page.textContent('#run-health tr[data-signal="weight_sync"]');
  check(/max [\d.e-]+ s \(step \d\)/.test(sync) && /ok/.test(sync), `the weight sync is timed and under budget: ${sync.replace(/\s+/g, " ")}`);
  await page.$eval("#run-health", (el) => el.scrollIntoView());
  await shot(page, "real-run-health");
  // Every rollout readable (issue 39): a trajectory opened from the run page shows its turns, its tokens on demand
  // (sampled ones with their log-probs) and its group side by side.
  await page.goto(`${base}/runs/${run}/`);
  await Promise.all([page.waitForNavigation(), page.click("#top-trajectories tbody a")]);
  const turns = await page.$$eval("#turns .turn, #chain .turn", (ts) => ts.length);
  const where = `${page.url()}: ${await page.title()}: ${(await page.textContent("main, body")).replace(/\s+/g, " ").slice(0, 600)}`;
  check(turns >= 1, `the trajectory shows its turns: ${turns} (${where})`);
  await page.click("#token-view summary");
  await page.waitForSelector("#token-body .tokens .tok", { timeout: 30000 });
  const titles = await page.$$eval("#token-body .tok[title^='log-prob']", (ts) => ts.length);
  check(titles >= 1, `sampled tokens carry their log-probs: ${titles}`);
  const gap = (await page.textContent("#token-mismatch")).replace(/\s+/g, " ").trim();
  const learner = await page.$$eval("#token-body .tok[title*='learner log-prob']", (ts) => ts.length);
  check(/tokens the learner scored/.test(gap) ? learner >= 1 : /did not score/.test(gap), `the learner's side: ${gap} (${learner} tokens)`);
  await shot(page, "trajectory-tokens");
  steps.push(`a trajectory opened from the run page shows ${turns} turns and ${titles} sampled tokens`);
  await Promise.all([page.waitForNavigation(), page.click("#group-link")]);
  const samples = await page.$$eval("#group-samples thead a", (as) => as.length);
  check(samples === 2, `its group shows its 2 samples side by side: ${samples}`);
  await shot(page, "trajectory-group");
  await page.goto(`${base}/?health=${process.env.CRUCIBLE_HEALTH}`);
  await page.waitForSelector(`#runs-grid a[href="/runs/${run}/"]`, { timeout: 30000 });
  const badge = await page.$eval(`#runs-grid tr:has(a[href="/runs/${run}/"]) .badge[class*="health-"]`, (b) => b.textContent.trim());
  check(badge === process.env.CRUCIBLE_HEALTH, `the run list shows its health and filters on it: ${badge}`);
}

// The first screen of a fresh installation: the "start here" panel links to launching a run, the review queue and
// the API docs, and the example run (CRUCIBLE_RUN, tagged "example") is listed; its page opens with charts drawn.
async function home(page) {
  await login(page, process.env.CRUCIBLE_USER, process.env.CRUCIBLE_PASSWORD);
  const run = process.env.CRUCIBLE_RUN;
  await page.goto(`${base}/`);
  await page.waitForSelector("#start-here");
  const links = await page.$$eval("#start-here a", (as) => as.map((a) => a.getAttribute("href")));
  for (const href of ["/runs/new/train/", "/review/", "/api/v1/docs/"]) {
    check(links.includes(href), `start here links ${href}`);
  }
  const row = `#runs-grid tr:has(a[href="/runs/${run}/"])`;
  await page.waitForSelector(row, { timeout: 30000 });
  const tags = await page.$$eval(`${row} a.badge[href^="?tag="]`, (bs) => bs.map((b) => b.textContent.trim()));
  check(tags.includes("example"), `the example run is on the first screen, tagged: ${tags.join(", ")}`);
  await shot(page, "home");
  await Promise.all([page.waitForNavigation(), page.click(`${row} a[href="/runs/${run}/"]`)]);
  await page.waitForSelector("#chart-metrics canvas", { timeout: 30000 });
  check(page.url().endsWith(`/runs/${run}/`), "the example run's page opens with its charts drawn");
}

// A queued run's page says why it waits, then turns running over the websocket without a reload; until its first
// step its health reads "no data yet" (issue 39: states that agree everywhere).
async function queued(page) {
  await login(page, process.env.CRUCIBLE_USER, process.env.CRUCIBLE_PASSWORD);
  const run = process.env.CRUCIBLE_RUN;
  await page.goto(`${base}/runs/${run}/`);
  const opened = (await page.textContent("#run-status")).trim();
  check(opened === "queued", `the page opens queued: ${opened}`);
  const notice = (await page.textContent("#run-queue")).replace(/\s+/g, " ").trim();
  check(/^Queued, position 1: waiting for/.test(notice), `it says why it waits: ${notice}`);
  check(!(await page.isVisible("#summary-health")), "a queued run shows no health badge");
  await page.waitForFunction(() => document.getElementById("ws-state")?.textContent.includes("live"), null, { timeout: 30000 });
  // Every state the page shows, with the health badge beside it (an out-of-band swap replaces the elements).
  await page.evaluate(() => {
    window.__sameDocument = true;
    window.__seen = [];
    setInterval(() => {
      const status = document.getElementById("run-status")?.textContent.trim();
      const health = document.getElementById("summary-health");
      const shown = health && !health.hidden ? health.textContent.trim() : "";
      const last = window.__seen[window.__seen.length - 1];
      if (!last || last.status !== status || last.health !== shown) window.__seen.push({ status, health: shown, queue: !document.getElementById("run-queue").hidden });
    }, 50);
  });
  await page.waitForFunction(() => window.__seen.some((s) => ["running", "succeeded", "failed", "stopped"].includes(s.status)), null, { timeout: 300000 });
  const seen = await page.evaluate(() => ({ same: window.__sameDocument, seen: window.__seen }));
  const states = seen.seen.map((s) => `${s.status}${s.health ? ` (${s.health})` : ""}`).join(" -> ");
  const running = seen.seen.find((s) => s.status === "running");
  check(seen.same && running, `the page turned running without a reload: ${states}`);
  check(running.health === "health no data yet" && !running.queue, `running before its first step: health reads "no data yet", the queue notice gone: ${states}`);
  await shot(page, "run-queued-to-running");
}

// An approver opens a decision that waits for them, approves it in the page, and the decision then shows one
// verdict: the title, the stages (checks, approval) and the approval card agree (issue 39).
async function decision(page) {
  await login(page, process.env.CRUCIBLE_USER, process.env.CRUCIBLE_PASSWORD);
  const url = `${base}/gates/decisions/${process.env.CRUCIBLE_DECISION}/`;
  await page.goto(url);
  const before = await page.$$eval("#decision-stages li", (ls) => ls.map((l) => l.textContent.replace(/\s+/g, " ").trim()));
  check(before.some((t) => /approval: waiting/.test(t)) && before.some((t) => /verdict: pending/.test(t)),
    `before: ${before.join(" | ")}`);
  check((await page.textContent("main")).includes("pass@1 on e2e-humaneval"), "the decision page shows the rule on its benchmark");
  await Promise.all([page.waitForNavigation(), page.click("#approve")]);
  await page.goto(url);
  const title = (await page.textContent("h1 .badge")).trim();
  const stages = await page.$$eval("#decision-stages li", (ls) => ls.map((l) => l.textContent.replace(/\s+/g, " ").trim()));
  const verdict = await page.$eval("#decision-stages", (o) => o.dataset.verdict);
  const head = (await page.textContent("main")).split("Rules")[0];
  check(title === "pass" && verdict === "pass" && !/pending|waiting/.test(head) && /approval: approved by/.test(stages.join(" ")),
    `an approved decision shows one verdict: ${verdict}`);
  steps.push(`an approved decision shows one verdict: pass`);
  await shot(page, "gate-decision");
}

// The first screen, a run page, a trajectory, the comparison and the training form at a phone's 390 pixels: no
// page is wider than the screen (the nav scrolls in one line, wide tables inside their card).
async function phone(page) {
  await login(page, process.env.CRUCIBLE_USER, process.env.CRUCIBLE_PASSWORD);
  const [first, second] = process.env.CRUCIBLE_RUNS.split(",");
  const urls = ["/", `/runs/${first}/`, `/runs/compare/?run=${first}&run=${second}`, "/runs/new/train/", "/review/", "/gates/"];
  for (const href of urls) {
    await page.goto(`${base}${href}`);
    await page.waitForLoadState("networkidle");
    // With isMobile the layout viewport grows to fit what overflows, so measure against the screen's 390 pixels,
    // and name the outermost elements that stick out.
    const wide = await page.evaluate(() => {
      const screen = window.screen.width;
      const clipped = (e) => { for (let a = e.parentElement; a; a = a.parentElement) { if (["auto", "scroll", "hidden"].includes(getComputedStyle(a).overflowX)) return true; } return false; };
      const out = Array.from(document.querySelectorAll("body *")).filter((e) => e.getBoundingClientRect().right > screen + 1 &&
        e.parentElement.getBoundingClientRect().right <= screen + 1 && !clipped(e));
      return { page: document.documentElement.scrollWidth, screen,
        widest: out.slice(0, 4).map((e) => `${e.tagName.toLowerCase()}${e.id ? "#" + e.id : ""}${e.className ? "." + String(e.className).split(" ")[0] : ""}:${Math.round(e.getBoundingClientRect().right)}`) };
    });
    check(wide.page <= wide.screen, `${href} at ${wide.screen} px has no horizontal scroll: ${wide.page} px wide ${wide.widest.join(" ")}`);
  }
  await page.goto(`${base}/runs/${first}/`);
  await page.waitForSelector('.small-chart[data-metric="loss"] canvas', { timeout: 30000 });
  await shot(page, "phone-run");
  await page.goto(`${base}/`);
  await shot(page, "phone-home");
}

// The training form's basic view: its default recipe's estimate is under 10 minutes here, and launching it with
// nothing changed is accepted (the test stops the run at once).
async function basic(page) {
  await login(page, process.env.CRUCIBLE_USER, process.env.CRUCIBLE_PASSWORD);
  await page.goto(`${base}/runs/new/train/`);
  check(!(await page.$eval("#advanced", (d) => d.open)), "the advanced settings start folded");
  const recipe = await page.$eval('select[name="recipe"]', (s) => s.value);
  const estimate = (await page.textContent("#run-estimate")).trim();
  const minutes = Number((estimate.match(/about (\d+(?:\.\d+)?) min/) || [])[1]);
  check(recipe === "cpu-lora" && minutes > 0 && minutes < 10, `the default recipe ${recipe} is estimated under 10 minutes: ${estimate}`);
  await shot(page, "launch-basic");
  await Promise.all([page.waitForNavigation(), page.click('main form button[type="submit"]')]);
  const errors = await page.$$eval(".errors li, .error", (es) => es.map((e) => e.textContent.trim()).filter(Boolean));
  check(/\/runs\/\d+\/$/.test(page.url()), `the default launch is accepted: ${page.url()} ${errors.join("; ")}`);
  steps.push(`launched ${page.url().match(/\/runs\/(\d+)\//)[1]}`);
}

// Pins are one user's: another user opening the same run sees the default layout (CRUCIBLE_OTHER_USER).
async function otherUser(browser, run) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  page.on("console", (msg) => { if (msg.type() === "error") problems.push(`console: ${msg.text()}`); });
  await login(page, process.env.CRUCIBLE_OTHER_USER, process.env.CRUCIBLE_PASSWORD);
  await page.goto(`${base}/runs/${run}/`);
  await page.waitForSelector('.small-chart[data-metric="loss"] canvas', { timeout: 30000 });
  const pinned = await page.$$eval('.chart-group[data-group="key"] .small-chart', (cs) => cs.map((c) => c.dataset.metric));
  const klShown = !!(await page.$('.small-chart[data-metric="kl"]'));
  check(!pinned.includes("reward/f_beta") && pinned[0] === "reward_mean" && klShown,
    `another user's layout is their own: ${pinned.join(", ")}; kl shown`);
  await context.close();
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
let code = 0;
try {
  // The phone flow is a phone: 390 CSS pixels, the page's meta viewport honoured (isMobile), touch.
  const phoneLike = { viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true, deviceScaleFactor: 2 };
  const page = await browser.newPage(flow === "phone" ? phoneLike : { viewport: { width: 1280, height: 900 } });
  page.on("console", (msg) => { if (msg.type() === "error") problems.push(`console: ${msg.text()}`); });
  page.on("pageerror", (err) => problems.push(`page error: ${err.message}`));
  await ({ launch, review, charts, pages, realrun, home, queued, decision, phone, basic })[flow](page);
  if (flow === "charts" && process.env.CRUCIBLE_OTHER_USER) await otherUser(browser, process.env.CRUCIBLE_RUNS.split(",")[0]);
  if (problems.length) throw new Error(problems.join("\n"));
} catch (err) {
  code = 1;
  console.error(String(err && err.stack || err));
} finally {
  await browser.close();
}
console.log(JSON.stringify({ flow, steps, problems }));
process.exit(code);
