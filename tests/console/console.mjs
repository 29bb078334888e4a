// Drives Debian's Chromium through the operator console, as an operator would: sign in, find
// the job in review, look at its attempts, resolve it (cancelling the confirmation once, then
// confirming), see its state change, see a tripped provider and reset it, read the safety
// counters and their charts, read a priced tenant's spend and budget, search jobs, sign out.
// Every wait is bounded; any failed step, any error in the page's console (a CSP violation
// included), any request to another origin and any URL holding the token fail the run.
// Screenshots of each step go to SHOTS.
//
//   GATEWAY=http://127.0.0.1:PORT ADMIN_TOKEN=… JOB=job_… TRIPPED=provider PROVIDER=provider \
//   SPEND='{"tenant":…,"provider":…,"route":…,"currency":"USD","jobs":2,"cost":"0.370371",
//           "day":"YYYY-MM-DD","day_used":"0.370371","day_limit":"5.000000",
//           "month_used":"0.370371","max_in_flight":3,
//           "currencies":["EUR","USD"]}' SHOTS=dir CHROMIUM=/usr/bin/chromium node console.mjs
//
// SPEND: what the Spend view must show for a tenant whose priced jobs completed today (UTC) on
// `provider`, the exact strings the gateway writes. CANCELED: a job the provider ended on our
// cancel, {"id", "provider", "route", "remote_id", "cost"} (cost as the Jobs view writes it).
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};
const gateway = env("GATEWAY"), token = env("ADMIN_TOKEN"), job = env("JOB");
const tripped = env("TRIPPED"), reviewProvider = env("PROVIDER"), shots = env("SHOTS");
const spend = JSON.parse(env("SPEND"));
const canceled = JSON.parse(env("CANCELED"));
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

  // Spend: this UTC month so far by default, every tenant. The priced tenant's row holds its
  // provider, currency, jobs and the exact cost string; its budget row what today counts.
  await page.click("#nav-spend");
  const cellsOf = (locator) => locator.locator("td").allTextContents();
  const same = (what, got, want) => {
    if (JSON.stringify(got) !== JSON.stringify(want))
      throw new Error(`${what}: ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`);
  };
  const today = new Date().toISOString().slice(0, 10);
  same("default dates", [await page.inputValue("#spend-from"), await page.inputValue("#spend-to")],
       [`${today.slice(0, 8)}01`, today]);
  const spendRow = (group) =>
    page.locator(`#spend-table tbody tr[data-tenant="${spend.tenant}"][data-group="${group}"]`)
      .filter({ hasText: spend.currency });
  await spendRow(spend.provider).waitFor({ state: "visible" });
  same("spend row", await cellsOf(spendRow(spend.provider)),
       [spend.tenant, spend.provider, spend.currency, String(spend.jobs), spend.cost]);
  const budgetRow = page.locator(`#budgets-table tbody tr[data-tenant="${spend.tenant}"]`);
  same("budget row", await cellsOf(budgetRow),
       [spend.tenant, spend.currency, `${spend.day_used} / ${spend.day_limit}`,
        `${spend.month_used} / no limit`, `0 / ${spend.max_in_flight}`]);
  // The chart of cost per day: drawn, one series per currency, the month's days on its axis.
  await page.locator("#chart-spend .uplot canvas").waitFor({ state: "visible" });
  for (const c of spend.currencies) await expectText(page.locator("#chart-spend .u-legend"), c);
  same("chart currencies", await page.getAttribute("#chart-spend", "data-currencies"),
       spend.currencies.join(" "));
  same("chart days", await page.getAttribute("#chart-spend", "data-days"),
       String(Number(today.slice(8, 10))));
  await shot("spend");

  // Grouped by route, then by day: the same cost under the route and under today.
  await page.selectOption("#spend-group", "route");
  await page.click("#spend-show");
  await spendRow(spend.route).waitFor({ state: "visible" });
  same("route row", await cellsOf(spendRow(spend.route)),
       [spend.tenant, spend.route, spend.currency, String(spend.jobs), spend.cost]);
  await page.selectOption("#spend-group", "day");
  await page.click("#spend-show");
  await spendRow(spend.day).waitFor({ state: "visible" });
  same("day row", await cellsOf(spendRow(spend.day)),
       [spend.tenant, spend.day, spend.currency, String(spend.jobs), spend.cost]);
  await shot("spend-by-day");
  // Days before any job: no row, the budget (today's) unchanged; dates the wrong way round are
  // refused in the page.
  await page.fill("#spend-from", "2000-01-01");
  await page.fill("#spend-to", "2000-01-31");
  await page.click("#spend-show");
  await page.locator("#spend-empty").waitFor({ state: "visible" });
  if (await page.locator("#spend-table tbody tr").count())
    throw new Error("spend rows in January 2000");
  same("chart days in January 2000", await page.getAttribute("#chart-spend", "data-days"), "31");
  same("budget row in January 2000", (await cellsOf(budgetRow))[2],
       `${spend.day_used} / ${spend.day_limit}`);
  await page.fill("#spend-from", "2000-02-01");
  await page.click("#spend-show");
  await expectText(page.locator("#status.error"), "is after");

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

  // A canceled job: found under its own state, with its remote id and cost, in a badge of its
  // own colour (not failed's, not completed's); opened, it shows the same and offers no decision.
  await page.click("#nav-jobs");
  await page.selectOption("#search-state", "canceled");
  await page.fill("#search-provider", canceled.provider);
  await page.click("#job-search-form button[type=submit]");
  const canceledRow = page.locator("#jobs-table tbody tr").filter({ hasText: canceled.id });
  await canceledRow.waitFor({ state: "visible" });
  same("canceled row", (await cellsOf(canceledRow)).slice(0, 5),
       [canceled.id, "canceled", `${canceled.provider} / ${canceled.route}`, canceled.remote_id,
        canceled.cost]);
  same("rows of the canceled search", await page.locator("#jobs-table tbody tr").count(), 1);
  const colours = await page.evaluate(() => {
    const colour = (cls) => {
      const b = document.createElement("span");
      b.className = `state ${cls}`;
      document.body.appendChild(b);
      const c = getComputedStyle(b).backgroundColor;
      b.remove();
      return c;
    };
    return { canceled: colour("state-canceled"), failed: colour("state-failed"),
             completed: colour("state-completed"), plain: colour("") };
  });
  if (new Set(Object.values(colours)).size !== 4)
    throw new Error(`badge colours not distinct: ${JSON.stringify(colours)}`);
  await shot("search-canceled");
  await page.fill("#search-id", canceled.id);
  await page.click("#job-id-form button[type=submit]");
  await expectText(page.locator("#job-id"), canceled.id);
  await expectText(page.locator("#job-state"), "canceled");
  const fact = async (name) => {
    const names = await page.locator("#job-facts dt").allTextContents();
    const i = names.indexOf(name);
    if (i < 0) throw new Error(`no fact ${name}: ${names.join(", ")}`);
    return page.locator("#job-facts dd").nth(i).textContent();
  };
  same("canceled remote id", await fact("remote id"), canceled.remote_id);
  same("canceled cost", await fact("cost"), canceled.cost);
  if ((await fact("cancel requested")) === "—") throw new Error("no cancel time shown");
  if (await page.locator("#resolve").isVisible()) throw new Error("a decision offered for a canceled job");
  await shot("job-canceled");

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
