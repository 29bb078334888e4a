// Drives Debian's Chromium through the operator console, as an operator would: sign in on the
// overview (jobs in doubt, jobs of 24 h by state, 30-day spend with the budget line, time to
// complete), find the job in review, look at its attempts, resolve it (cancelling the confirmation once, then
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
// WATCH: {"unknown": a job in unknown, "pages": {"tenant", "ids", "keys", "route"} (a tenant's
// completed jobs, newest first), "archived": {"id", "bytes": [size of each output]}}.
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
const watch = JSON.parse(env("WATCH"));
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
  // The type of every blob the page makes a URL of (the console's CSP lets nothing read one
  // back): the download links' are checked below.
  await page.addInitScript(() => {
    const made = URL.createObjectURL.bind(URL);
    window.__blobTypes = {};
    URL.createObjectURL = (b) => {
      const u = made(b);
      window.__blobTypes[u] = `${b.type} ${b.size}`;
      return u;
    };
  });
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

  const cellsOf = (locator) => locator.locator("td").allTextContents();
  const same = (what, got, want) => {
    if (JSON.stringify(got) !== JSON.stringify(want))
      throw new Error(`${what}: ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`);
  };

  // The landing page is the overview: the unknown job and the review job are counted (issue 24:
  // it used to say "Nothing waits for a decision" while jobs sat in unknown).
  await page.locator("#view-overview").waitFor({ state: "visible" });
  await page.waitForFunction(() => ["unknown", "review"].every((s) =>
    Number(document.getElementById(`doubt-${s}`).dataset.count) >= 1));
  for (const s of ["unknown", "review"]) {
    const card = page.locator(`#doubt-${s}`);
    if (!(await card.evaluate((e) => e.classList.contains("attention"))))
      throw new Error(`the ${s} card does not ask for attention`);
    if (!(await card.locator('[data-field="job"] a').count())) throw new Error(`no oldest ${s}`);
  }
  // Jobs of the last 24 h by state: a chart with a series per state present, and a table.
  await page.locator("#chart-hours .uplot canvas").waitFor({ state: "visible" });
  for (const s of ["unknown", "review", "completed"])
    await expectText(page.locator("#chart-hours .u-legend"), s);
  const unknownRow = await cellsOf(page.locator('#states-table tr[data-state="unknown"]'));
  if (!(Number(unknownRow[1]) >= 1)) throw new Error(`unknown in 24 h: ${unknownRow}`);
  // Spend over 30 days: the priced tenant in USD, its provider/model series and its budget line.
  await page.selectOption("#spend30-tenant", spend.tenant);
  await page.selectOption("#spend30-currency", "USD");
  const series = `${spend.provider} / ${spend.model}`;
  await expectText(page.locator("#chart-spend30 .u-legend"), series);
  await expectText(page.locator("#chart-spend30 .u-legend"), "daily budget");
  same("budget line", await page.getAttribute("#chart-spend30", "data-budget"), spend.day_limit);
  same("30-day series", await page.getAttribute("#chart-spend30", "data-series"), series);
  same("30-day row", await cellsOf(page.locator("#spend30-table tbody tr")),
       [spend.provider, spend.model, "USD", String(spend.jobs), spend.cost]);
  await expectText(page.locator("#spend30-totals"), `${spend.day_used} / ${spend.day_limit}`);
  // Time to complete: the priced provider's two jobs.
  const latency = await cellsOf(page.locator(`#latency-table tr[data-provider="${spend.provider}"]`));
  if (latency[1] !== "2" || !latency[2].endsWith("s") || !latency[3].endsWith("s"))
    throw new Error(`time to complete: ${latency.join(" | ")}`);
  await shot("overview");
  // Every tenant again: the budget line goes (budgets are per tenant).
  await page.selectOption("#spend30-tenant", "");
  same("no budget line for every tenant", await page.getAttribute("#chart-spend30", "data-budget"),
       "");

  // The review queue lists the job, and says that a job is unknown; the job opens with its
  // attempt timeline.
  await page.click("#nav-review");
  const queued = page.locator(`#review-table tr[data-job="${job}"]`);
  await queued.waitFor({ state: "visible" });
  await expectText(page.locator("#review-unknown"), "unknown");
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
  await page.click("#nav-review");
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
  const canceledCells = await cellsOf(canceledRow);
  same("canceled row", [0, 1, 4, 5].map((i) => canceledCells[i]),
       [canceled.id, "canceled", `${canceled.provider} / ${canceled.route}`, canceled.cost]);
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

  // Jobs, newest first, a page at a time: the paged tenant's twelve, ten and then two.
  await page.click("#nav-jobs");
  await page.selectOption("#search-state", "");
  await page.fill("#search-provider", "");
  await page.fill("#search-tenant", watch.pages.tenant);
  await page.selectOption("#jobs-limit", "10");
  await page.click("#job-search-form button[type=submit]");
  const ids = () => page.locator("#jobs-table tbody tr").evaluateAll((rows) =>
    rows.map((r) => r.dataset.job));
  await page.waitForFunction((first) =>
    document.querySelector("#jobs-table tbody tr")?.dataset.job === first, watch.pages.ids[0]);
  same("page 1", await ids(), watch.pages.ids.slice(0, 10));
  const jobCells = await cellsOf(page.locator(`#jobs-table tr[data-job="${watch.pages.ids[0]}"]`));
  same("job row", jobCells.slice(0, 6), [watch.pages.ids[0], "completed", watch.pages.tenant,
                                      watch.pages.keys[0], watch.pages.route, "—"]);
  if (!/s$/.test(jobCells[6])) throw new Error(`duration: ${jobCells[6]}`);
  await expectText(page.locator("#jobs-page"), "Page 1");
  await shot("jobs-page-1");
  await page.click("#jobs-next");
  await expectText(page.locator("#jobs-page"), "Page 2 (the last)");
  same("page 2", await ids(), watch.pages.ids.slice(10));
  if (!(await page.locator("#jobs-next").isDisabled())) throw new Error("an older page offered");
  await shot("jobs-page-2");
  await page.click("#jobs-first");
  await expectText(page.locator("#jobs-page"), "Page 1");
  // By idempotency key, whatever the tenant: the one job.
  await page.fill("#search-tenant", "");
  await page.fill("#search-key", watch.pages.keys[5]);
  await page.click("#job-search-form button[type=submit]");
  await page.waitForFunction((id) => {
    const rows = document.querySelectorAll("#jobs-table tbody tr");
    return rows.length === 1 && rows[0].dataset.job === id;
  }, watch.pages.ids[5]);
  same("by key", (await cellsOf(page.locator("#jobs-table tbody tr"))).slice(0, 4),
       [watch.pages.ids[5], "completed", watch.pages.tenant, watch.pages.keys[5]]);
  await shot("jobs-by-key");

  // Output previews: the archived bytes of each output, read with the admin token.
  await page.fill("#search-id", watch.archived.id);
  await page.click("#job-id-form button[type=submit]");
  await expectText(page.locator("#job-id"), watch.archived.id);
  for (const [n, bytes] of watch.archived.bytes.entries()) {
    const fig = page.locator(`#outputs figure[data-index="${n}"]`);
    await fig.waitFor({ state: "visible" });
    await page.waitForFunction((sel) => document.querySelector(sel)?.dataset.bytes,
                               `#outputs figure[data-index="${n}"]`);
    same(`output ${n} bytes`, await fig.getAttribute("data-bytes"), String(bytes));
    const src = await fig.locator("img").getAttribute("src");
    if (!src || !src.startsWith("blob:")) throw new Error(`output ${n} preview src: ${src}`);
    await expectText(fig.locator("figcaption"), `${bytes} bytes`);
    // The download is the same bytes typed as plain bytes, never the provider's type: opened in
    // a tab, an HTML or SVG output would otherwise be a document of the console's origin.
    const href = await fig.locator("a").getAttribute("href");
    same(`output ${n} download`, await page.evaluate((u) => window.__blobTypes[u], href),
         `application/octet-stream ${bytes}`);
  }
  if (await page.locator("#outputs-none").isVisible()) throw new Error("'no output' shown");
  await shot("job-outputs");

  // A stored answer that is not JSON (an HTML page here; a stream's events, text) is not shown,
  // its size only: a prompt it echoes could not be told apart. Before, its base64 was.
  await page.click("#nav-jobs");
  await page.fill("#search-id", watch.html);
  await page.click("#job-id-form button[type=submit]");
  await expectText(page.locator("#job-id"), watch.html);
  await expectText(page.locator("#job-result"), "(not shown: a body that is not JSON, ");
  const result = await page.locator("#job-result").textContent();
  if (result.includes("PGh0bWw") || result.includes("body_base64\": \"P"))
    throw new Error(`a body that is not JSON shown: ${result.slice(0, 300)}`);

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
