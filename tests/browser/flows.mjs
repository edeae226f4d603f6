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
