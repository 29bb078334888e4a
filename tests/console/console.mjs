// Drives Debian's Chromium through the operator console, as an operator would: sign in, find
// the job in review, look at its attempts, resolve it (cancelling the confirmation once, then
// confirming), see its state change, see a tripped provider and reset it, read the safety
// counters and their charts, search jobs, sign out. Every wait is bounded; any failed step, any
// error in the page's console (a CSP violation included), any request to another origin and any
// URL holding the token fail the run. Screenshots of each step go to SHOTS.
//
//   GATEWAY=http://127.0.0.1:PORT ADMIN_TOKEN=… JOB=job_… TRIPPED=provider PROVIDER=provider \
//   SHOTS=dir CHROMIUM=/usr/bin/chromium node console.mjs
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};
const gateway = env("GATEWAY"), token = env("ADMIN_TOKEN"), job = env("JOB");
const tripped = env("TRIPPED"), reviewProvider = env("PROVIDER"), shots = env("SHOTS");
mkdirSync(shots, { recursive: true });

const problems = [];
let refusalExpected = false; // the one 401 of signing in with a wrong token
const browser = await chromium.launch({
  executablePath: env("CHROMIUM"),
  // As root (CI) Chromium refuses its sandbox; the page is our own, on loopback.
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  timeout: 60_000,
});
let step = 0;
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  page.setDefaultTimeout(15_000);
  const origin = new URL(gateway).origin;
  page.on("request", (req) => {
    const url = req.url();
    if (!url.startsWith("data:") && new URL(url).origin !== origin)
      problems.push(`request to another origin: ${url}`);
    if (url.includes(token)) problems.push(`the token in a URL: ${url}`);
  });
  page.on("console", (msg) => {
    if (msg.type() === "error" && !(refusalExpected && msg.text().includes("status of 401")))
      problems.push(`console error: ${msg.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));

  const shot = async (name) => {
    step += 1;
    const path = `${shots}/${String(step).padStart(2, "0")}-${name}.png`;
    await page.screenshot({ path, fullPage: true });
    console.log(`screenshot ${path}`);
  };
  const expectText = async (locator, text) => {
    await locator.filter({ hasText: text }).first().waitFor({ state: "visible" });
  };

  // Sign in.
  const r = await page.goto(`${gateway}/console`);
  if (r.status() !== 200) throw new Error(`/console answered ${r.status()}`);
  await page.locator("#signin-form").waitFor({ state: "visible" });
  await shot("signin");
  refusalExpected = true;
  await page.fill("#token", "not-the-admin-token");
  await page.click("#signin-button");
  await expectText(page.locator("#signin-error"), "refused");
  refusalExpected = false;
  await page.fill("#token", token);
  await page.click("#signin-button");
  await page.locator("#nav").waitFor({ state: "visible" });

  // The review queue lists the job; it opens with its attempt timeline.
  const queued = page.locator(`#review-table tr[data-job="${job}"]`);
  await queued.waitFor({ state: "visible" });
  await shot("review-queue");
  await queued.click();
  await expectText(page.locator("#job-id"), job);
  await expectText(page.locator("#job-state"), "review");
  await expectText(page.locator("#attempts-table tbody td"), "ambiguous");
  await page.locator("#resolve").waitFor({ state: "visible" });
  await shot("job-in-review");

  // Resolve it as found; the first confirmation is cancelled and changes nothing.
  await page.fill("#operator", "console-test");
  await page.fill("#remote-id", "task_seen_in_console");
  await page.click("#resolve-found");
  await page.locator("#confirm").waitFor({ state: "visible" });
  await expectText(page.locator("#confirm-text"), "task_seen_in_console");
  await shot("confirm-found");
  await page.click("#confirm-cancel");
  await expectText(page.locator("#status"), "Nothing was done");
  await expectText(page.locator("#job-state"), "review");
  await page.click("#resolve-found");
  await page.click("#confirm-ok");
  await expectText(page.locator("#job-state"), "completed");
  await expectText(page.locator("#status"), "now completed");
  await expectText(page.locator("#job-facts dd"), "console-test");
  if (await page.locator("#resolve").isVisible()) throw new Error("decision offered after it");
  await shot("resolved");

  // A reload keeps the session (sessionStorage) and puts nothing in the URL.
  await page.reload();
  await page.locator("#nav").waitFor({ state: "visible" });
  if (page.url() !== `${gateway}/console`) throw new Error(`URL after reload: ${page.url()}`);
  await page.locator("#review-table").waitFor({ state: "visible" });
  await page.click("#review-refresh");
  if (await page.locator(`#review-table tr[data-job="${job}"]`).count())
    throw new Error("the resolved job is still in the review queue");

  // The tripped provider, and its reset.
  await page.click("#nav-providers");
  const row = page.locator(`#providers-table tr[data-provider="${tripped}"]`);
  await expectText(row, "tripped");
  await shot("provider-tripped");
  await row.getByRole("button", { name: "Reset" }).click();
  await page.click("#confirm-ok");
  await expectText(page.locator("#status"), "breaker reset");
  await expectText(row, "ok");
  if (await row.getByRole("button", { name: "Reset" }).count())
    throw new Error("a reset button beside a provider that is not tripped");
  await shot("provider-reset");

  // Safety counters from /metrics: the job entered review once at least.
  await page.click("#nav-safety");
  const entered = page.locator('#safety-table tr[data-metric="idemgate_review_entered_total"]');
  await entered.waitFor({ state: "visible" });
  const cells = await entered.locator("td").allTextContents();
  if (!(Number(cells[1]) >= 1)) throw new Error(`review entered: ${cells.join(" | ")}`);
  // The charts (uPlot, embedded): drawn, with their series named, and fed a second sample.
  await page.locator("#chart-states .uplot canvas").waitFor({ state: "visible" });
  await expectText(page.locator("#chart-states .u-legend"), "review");
  await expectText(page.locator("#chart-safety .u-legend"), "entered review");
  await page.waitForFunction(() => Number(document.getElementById("chart-safety").dataset.samples)
                             >= 2, null, { timeout: 20_000 });
  await shot("safety");

  // Search: by state and provider, then by id.
  await page.click("#nav-jobs");
  await page.selectOption("#search-state", "completed");
  await page.fill("#search-provider", reviewProvider);
  await page.click("#job-search-form button[type=submit]");
  await expectText(page.locator("#jobs-table tbody td"), job);
  await shot("search");
  await page.click("#nav-jobs");
  await page.fill("#search-id", job);
  await page.click("#job-id-form button[type=submit]");
  await expectText(page.locator("#job-id"), job);
  await expectText(page.locator("#job-state"), "completed");

  // Sign out: the token is gone from the tab.
  await page.click("#sign-out");
  await page.locator("#signin-form").waitFor({ state: "visible" });
  const kept = await page.evaluate(() => sessionStorage.length);
  if (kept !== 0) throw new Error(`sessionStorage still holds ${kept} item(s)`);
} finally {
  await browser.close();
}
if (problems.length) {
  console.error(problems.join("\n"));
  process.exit(1);
}
console.log("console: every step passed");
