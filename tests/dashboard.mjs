// The dashboard in Debian's headless Chromium, driven by puppeteer-core (tests/dashboard_python.py
// runs it): a wrong key is refused; the right one signs in; a fine-tune is started from the page
// (upload + submit); its loss curve is drawn and grows while it trains; the job completes with its
// evaluation table and artifacts shown; the scheduler's operator port shows queues, shares and
// Jain's index. Screenshots go to OUT_DIR.
// usage: node tests/dashboard.mjs API_BASE SCHEDULER_BASE API_KEY TRAIN.jsonl OUT_DIR
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "browser", "package.json"));
const puppeteer = require("puppeteer-core");

const [api, sched, key, train, outDir] = process.argv.slice(2);
const out = {};
const browser = await puppeteer.launch({
  executablePath: process.env.LATHE_CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
});
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(`${api}/dashboard/`, { waitUntil: "networkidle0" });
  await page.waitForSelector("#signin-view:not([hidden])");

  await page.type("#key", "lt_nokey_nosecret");
  await page.click("#signin");
  await page.waitForFunction(() => document.getElementById("signin-error").textContent.length > 0);
  out.bad_key_error = await page.$eval("#signin-error", (e) => e.textContent);

  await page.$eval("#key", (e) => { e.value = ""; });
  await page.type("#key", key);
  await page.click("#signin");
  await page.waitForSelector("#tenant-view:not([hidden])");
  out.signed_in = true;

  const file = await page.$("#file");
  await file.uploadFile(train);
  await page.$eval("#max_steps", (e) => { e.value = "60"; });
  await page.$eval("#lr", (e) => { e.value = "0.003"; });
  await page.click("#submit");
  await page.waitForFunction(() => document.getElementById("detail-title").textContent.startsWith("job-"), { timeout: 60000 });
  out.job = await page.$eval("#detail-title", (e) => e.textContent);

  const pointsNow = () => page.$eval("#loss", (c) => Number(c.dataset.points));
  await page.waitForFunction(() => Number(document.getElementById("loss").dataset.points) >= 2, { timeout: 300000 });
  out.points_first = await pointsNow();
  await page.screenshot({ path: path.join(outDir, "dashboard-training.png") });
  await page.waitForFunction((n) => Number(document.getElementById("loss").dataset.points) > n, { timeout: 300000 },
    out.points_first);
  out.points_later = await pointsNow();
  // Drawn, not only counted: the curve's blue pixels on the canvas.
  out.curve_pixels = await page.$eval("#loss", (c) => {
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0 && d[i + 2] > 150 && d[i] < 100) n++;
    return n;
  });

  await page.waitForFunction(() => document.getElementById("state").textContent === "completed" &&
    document.querySelectorAll("#artifacts li").length > 0, { timeout: 600000 });
  out.points_final = await pointsNow();
  out.state = await page.$eval("#state", (e) => e.textContent);
  out.eval_rows = await page.$$eval("#evals tbody tr", (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)));
  out.artifacts = await page.$$eval("#artifacts li", (li) => li.map((l) => l.textContent));
  out.jobs_listed = await page.$$eval("#jobs tbody tr", (rows) => rows.map((r) => r.dataset.id));
  await page.screenshot({ path: path.join(outDir, "dashboard-completed.png") });
  out.page_errors = errors;

  const op = await browser.newPage();
  await op.setViewport({ width: 1280, height: 700 });
  await op.goto(`${sched}/dashboard/`, { waitUntil: "networkidle0" });
  await op.waitForSelector("#operator-view:not([hidden])", { timeout: 30000 });
  await op.waitForFunction(() => document.querySelectorAll("#queue tbody tr").length > 0, { timeout: 30000 });
  out.operator_rows = await op.$$eval("#queue tbody tr", (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)));
  out.operator_jain = await op.$$eval("#jain tbody tr", (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)));
  out.operator_workers = await op.$$eval("#workers tbody tr", (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)));
  out.operator_fleet = await op.$$eval("#fleet tbody tr", (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent)));
  await op.screenshot({ path: path.join(outDir, "dashboard-operator.png") });
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
