// What an annotator sees on a round's labeling page, in a real headless Chromium
// (playwright-core, the browser Debian ships at /usr/bin/chromium). Driven by
// scripts/labelstudio_page_check.py, which starts the server, exports the round and reads
// the vote back; this file only logs in, looks, votes and takes screenshots.
//
// argv: URL EMAIL PASSWORD PROJECT_ID OUT_DIR. Prints one JSON object on stdout: what it
// saw (the instructions' text, the definitions on the page, the screenshots).
import { createRequire } from "node:module";
import path from "node:path";

// playwright-core is installed outside the repository (PRB_BROWSER_CACHE/node_modules)
const require = createRequire(path.join(process.env.PRB_BROWSER_CACHE || ".", "package.json"));
const { chromium } = require("playwright-core");

const [url, email, password, projectId, outDir] = process.argv.slice(2);
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const seen = { url, project: Number(projectId), screenshots: [] };

const browser = await chromium.launch({
  executablePath,
  headless: true,
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
  ],
});
try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 1000 } });
  page.setDefaultTimeout(120000);
  await page.goto(`${url}/user/login/`);
  await page.fill('input[name="email"]', email);
  await page.fill('input[name="password"]', password);
  await Promise.all([page.waitForNavigation(), page.click('button[type="submit"], input[type="submit"]')]);
  seen.logged_in = !page.url().includes("/user/login");

  // "Label All Tasks": the labeling stream, where show_instruction opens the instructions
  await page.goto(`${url}/projects/${projectId}/data?labeling=1`);
  const modal = page.locator(".ant-modal, [class*='modal']").filter({ hasText: "Annotator guidelines" });
  await modal.first().waitFor({ state: "visible" });
  seen.instructions_shown_before_the_task = true;
  seen.instructions_text = (await modal.first().innerText()).slice(0, 4000);
  const shot1 = path.join(outDir, "labelstudio-instructions.png");
  await modal.first().screenshot({ path: shot1 });
  seen.screenshots.push(shot1);

  // close the instructions (their OK / close button), then the task itself
  const close = modal.first().locator("button").filter({ hasText: /OK|Close|Got it/i });
  if (await close.count()) await close.first().click();
  else await page.keyboard.press("Escape");
  await page.getByText("Which answer fits this user's expectations better?").first().waitFor();
  const body = await page.locator("body").innerText();
  seen.definitions_on_the_page = [
    "both bad: neither answer is acceptable",
    "tie: both answers cover",
    "general quality differs: one answer is noticeably better or worse",
    "rubric unclear: the rubric is vague",
    "Do not reward length, polish, formatting or confident tone on their own.",
  ].filter((t) => body.includes(t));
  const shot2 = path.join(outDir, "labelstudio-task.png");
  await page.screenshot({ path: shot2, fullPage: true });
  seen.screenshots.push(shot2);

  // a vote through the page: choice A (the first radio, "A[1]"), then Submit
  await page.locator("input[type=radio]").first().check({ force: true });
  seen.choice_checked = await page.locator("input[type=radio]").first().isChecked();
  const posted = page.waitForResponse(
    (r) => r.url().includes("/annotations") && r.request().method() === "POST",
  );
  await page.getByRole("button", { name: /^Submit/ }).first().click();
  seen.submit_status = (await posted).status();
  seen.submitted = seen.submit_status < 300;
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
