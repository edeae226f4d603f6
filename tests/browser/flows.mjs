// Browser flows against a live Crucible (tests/test_browser.py starts the stack and runs this file).
// playwright-core drives Debian's chromium; every step asserts, and any console error or page error fails the run.
// Usage: CRUCIBLE_URL=http://127.0.0.1:8000 CRUCIBLE_USER=operator CRUCIBLE_PASSWORD=... node flows.mjs <flow>
import { chromium } from "playwright-core";

const base = process.env.CRUCIBLE_URL;
const flow = process.argv[2] || "launch";
const problems = [];
const steps = [];

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

async function review(page) {
  // Filled in by the review-queue flow (keyboard labelling); see tests/test_browser.py.
  await login(page, process.env.CRUCIBLE_USER, process.env.CRUCIBLE_PASSWORD);
  const start = process.env.CRUCIBLE_REVIEW_URL;
  await page.goto(`${base}${start}`);
  await page.waitForSelector("[data-review-item]", { timeout: 30000 });
  const first = await page.getAttribute("[data-review-item]", "data-review-item");
  check(first, `review item ${first} shown`);
  check(await page.locator(".evidence, [data-evidence]").count() > 0, "detector evidence highlighted");
  await page.keyboard.press("1");  // confirmed hack
  await page.waitForFunction((id) => {
    const el = document.querySelector("[data-review-item]");
    return !el || el.getAttribute("data-review-item") !== id;
  }, first, { timeout: 30000 });
  steps.push("labelled with the keyboard (1 = confirmed hack); the next item loaded");
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
let code = 0;
try {
  const page = await browser.newPage();
  page.on("console", (msg) => { if (msg.type() === "error") problems.push(`console: ${msg.text()}`); });
  page.on("pageerror", (err) => problems.push(`page error: ${err.message}`));
  await ({ launch, review })[flow](page);
  if (problems.length) throw new Error(problems.join("\n"));
} catch (err) {
  code = 1;
  console.error(String(err && err.stack || err));
} finally {
  await browser.close();
}
console.log(JSON.stringify({ flow, steps, problems }));
process.exit(code);
