"""The dashboard in a real headless Chromium (Debian's chromium and chromedriver, driven by Selenium) against
real serving, Redis, MLflow and SQL: each page loads with no console error and no failed request; the models
page shows what `exa serve check` reports; a split set from the page is what `exa serve traffic` shows; a
promotion from the page is in the audit trail under the identity that made it; an identity without the
operator permission is refused.

Screenshots of each page go to ``$EXAMLOPS_SCREENSHOTS`` when set, else to this test's temp folder; the test
prints where. Skipped, saying why, only where Chromium or its driver is missing (``scripts/setup.sh`` installs
both as root).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from examlops.bootstrap import prepare_platform, upgrade_database
from examlops.cli.main import app as exa
from examlops.core.settings import Settings
from examlops.platform.redis_server import EmbeddedRedis
from tests.integration.servers import ServingProcess
from tests.ports import free_port

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = os.environ.get("EXAMLOPS_SCREENSHOTS")  # read at import: an autouse fixture clears EXAMLOPS_*
PAGES = ("models", "drift", "control", "traces", "models/JPCP/runs")


@dataclass
class Platform:
    server: ServingProcess
    env: dict[str, str]
    operator: str
    caller: str

    def exa(self, *args: str) -> Any:
        result = CliRunner().invoke(exa, [*args, "--json"], env=self.env)
        assert result.exit_code in (0, 1), result.output
        return json.loads(result.stdout)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    home = tmp_path_factory.mktemp("dashboard")
    redis = EmbeddedRedis(home / "redis", free_port())
    redis.start()
    settings = Settings(home=home, redis={"url": redis.url})
    upgrade_database(settings)
    prepare_platform(settings)  # as `exa up` does: the demo's aliases on the audit trail, so verify covers them
    port = free_port()
    # The port in the settings too: a promotion from the page asks the settings' instances to reload.
    env = {"EXAMLOPS_REDIS__URL": redis.url, "EXAMLOPS_PREDICT__WORKERS": "1", "EXAMLOPS_SERVING__PORT": str(port)}
    server = ServingProcess(home, env=env, port=port)
    try:
        server.wait_ready()
        drift_rows(settings)
        cli_env = {"EXAMLOPS_HOME": str(home), **env}
        tokens = {}
        for name, role, extra in (("ops", "operator", []), ("viewer", "caller", ["--model", "JPCP"])):
            added = CliRunner().invoke(exa, ["identity", "add", name, "--role", role, *extra, "--json"], env=cli_env)
            assert added.exit_code == 0, added.output
            tokens[name] = json.loads(added.stdout)["token"]
        yield Platform(server, cli_env, tokens["ops"], tokens["viewer"])
    finally:
        server.stop()
        redis.stop()


def drift_rows(settings: Settings) -> None:
    """Three reports' status rows for JPCP, as the drift-report flow stores them (Evidently is not what is
    tested here: its flow has its own tests), each with its HTML file."""
    from datetime import UTC, datetime, timedelta

    from sqlmodel import Session

    from examlops.bootstrap import sql_engine
    from examlops.monitoring.drift_store import DriftStatus

    folder = settings.state_dir / "drift" / "JPCP"
    folder.mkdir(parents=True, exist_ok=True)
    engine = sql_engine(settings)
    start = datetime.now(UTC) - timedelta(hours=1)
    try:
        with Session(engine) as session:
            for i, (prediction, embedding) in enumerate(((0.62, 0.48), (0.21, 0.35), (0.01, 0.03))):
                html = folder / f"report-{i}.html"
                html.write_text(f"<html><body>report {i}</body></html>")
                at = start + timedelta(minutes=15 * i)
                for kind, score in (("prediction", prediction), ("input", embedding)):
                    session.add(DriftStatus(
                        model="JPCP", kind=kind, version="1", drifted=score < 0.05, score=score, method="ks",
                        threshold=0.05, columns="[]", reference="training", reference_rows=500, current_rows=200,
                        first_id=f"{i}-0", last_id=f"{i}-1", window_start=at, window_end=at + timedelta(minutes=15),
                        report_html=str(html), report_json=str(html.with_suffix(".json")), created_at=at,
                    ))  # fmt: skip
            session.commit()
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip(f"{CHROMIUM} or {CHROMEDRIVER} missing: `bash scripts/setup.sh` as root installs Debian's "
                    "chromium and chromium-driver")  # fmt: skip
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # Without the background-networking flags Chromium keeps dialling hosts this machine cannot reach.
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1366,1000",
        f"--user-data-dir={tmp_path / 'chrome'}",
    ):
        options.add_argument(flag)  # fmt: skip
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    driver.get("about:blank")
    problems(driver)  # drop what Chromium's own start-up page logged (its new-tab page fails a lookup)
    try:
        yield driver
    finally:
        driver.quit()


def log_in(driver: Any, base: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/dashboard/login")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "login").click()
    wait_for(driver, lambda d: d.current_url.endswith("/dashboard/models"))


def wait_for(driver: Any, condition: Any, timeout_s: float = 20.0) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout_s).until(condition)


def problems(driver: Any) -> list[str]:
    """Console errors and failed or refused requests since the last call (the logs are drained on read)."""
    found = [f"console: {e['message']}" for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    urls: dict[str, str] = {}
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message["method"] == "Network.requestWillBeSent":
            urls[params["requestId"]] = params["request"]["url"]
        elif message["method"] == "Network.loadingFailed" and not params.get("canceled"):
            url = urls.get(params["requestId"], "?")
            found.append(f"failed: {params.get('errorText')} ({params.get('type')}) {url}")
        elif message["method"] == "Network.responseReceived" and params["response"]["status"] >= 400:
            found.append(f"status {params['response']['status']}: {params['response']['url']}")
    return found


def screenshot(driver: Any, path: Path, width: int = 1366) -> None:
    """The whole page, not only the window: the window grows to the page's height for the shot."""
    driver.set_window_size(width, 1000)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, min(max(1000, int(height) + 120), 4000))
    driver.save_screenshot(str(path))
    driver.set_window_size(1366, 1000)


def charts_drawn(driver: Any) -> bool:
    from selenium.webdriver.common.by import By

    charts = driver.find_elements(By.CSS_SELECTOR, ".chart")
    return all(c.find_elements(By.TAG_NAME, "canvas") or c.text in ("no data yet", "one point so far") for c in charts)


def test_dashboard_in_chromium(
    platform: Platform, browser: Any, shots: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from selenium.webdriver.common.by import By

    base = platform.server.url
    log_in(browser, base, platform.operator)
    # Predictions while the models page is open: its rate charts draw a line from their second point.
    for _ in range(3):
        platform.exa("serve", "infer-check", "--model", "AC")
        browser.execute_script("return new Promise(r => setTimeout(r, 2500))")
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '.chart[data-model="AC"] canvas'), timeout_s=30)

    # Every page loads its own assets only, with no console error and no failed request, through a refresh.
    for name in PAGES:
        browser.get(f"{base}/dashboard/{name}")
        wait_for(browser, charts_drawn)
        browser.execute_script("return new Promise(r => setTimeout(r, 6000))")  # one in-place refresh
        assert problems(browser) == [], name
        screenshot(browser, shots / f"{name.replace('/', '-')}.png")
    browser.get(f"{base}/dashboard/models")
    wait_for(browser, charts_drawn)
    screenshot(browser, shots / "models-tablet.png", width=800)
    assert problems(browser) == []

    # The drift page charts the p-values of the reports and links each report.
    browser.get(f"{base}/dashboard/drift")
    wait_for(browser, charts_drawn)
    assert browser.find_elements(By.CSS_SELECTOR, '.chart[data-model="JPCP"] canvas')
    assert len(browser.find_elements(By.LINK_TEXT, "Evidently HTML")) == 6

    # The models page shows the versions `exa serve check` reports.
    browser.get(f"{base}/dashboard/models")
    check = platform.exa("serve", "check")
    assert check["ready"] is True
    for entry in check["models"]:
        cell = browser.find_element(By.ID, f"version-{entry['model']}-{entry['alias']}")
        assert cell.text == entry["version"], entry

    # A split set from the page is what `exa serve traffic` shows.
    for alias, weight in (("production", "70"), ("canary", "30"), ("staging", "")):
        field = browser.find_element(By.ID, f"split-JPCP-{alias}")
        field.clear()
        if weight:
            field.send_keys(weight)
    browser.find_element(By.ID, "set-split-JPCP").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "confirm"))  # the click loads the confirmation page
    assert "Production 70 % / Canary 30 %" in browser.find_element(By.ID, "description").text
    screenshot(browser, shots / "confirm.png")
    browser.find_element(By.ID, "confirm").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "result"))
    assert "traffic split is now" in browser.find_element(By.ID, "result").text
    assert platform.exa("serve", "traffic", "JPCP")["weights"] == {"Production": 70, "Canary": 30}

    # A promotion from the page is in the audit trail, made by the identity that logged in.
    browser.get(f"{base}/dashboard/models")
    canary = browser.find_element(By.ID, "version-AC-Canary").text
    browser.find_element(By.ID, "promote-AC").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "confirm"))
    browser.find_element(By.ID, "confirm").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "result"), timeout_s=90)
    assert f"-> {canary}" in browser.find_element(By.ID, "result").text
    assert problems(browser) == []
    moved = [e for e in platform.exa("audit", "tail", "-n", "50") if e["type"] == "alias.moved"]
    assert moved and moved[-1]["subject"] == "AC" and moved[-1]["data"]["actor"] == "ops"
    assert moved[-1]["data"]["new_version"] == canary
    verified = platform.exa("audit", "verify")  # stores its result: the Control page shows it, walking nothing
    browser.get(f"{base}/dashboard/control")
    assert "ops" in browser.find_element(By.ID, "audit").text
    assert verified["ok"] and f"intact: {verified['events']} events" in browser.find_element(By.ID, "verify").text
    assert "UTC" in browser.find_element(By.ID, "verified-at").text
    screenshot(browser, shots / "control-after-promotion.png")

    # An identity without the operator permission sees no action, and an action it asks for is refused.
    browser.delete_all_cookies()
    log_in(browser, base, platform.caller)
    assert not browser.find_elements(By.ID, "promote-JPCP")
    assert "read-only" in browser.page_source
    screenshot(browser, shots / "models-as-caller.png")
    jpcp_moves = [e for e in platform.exa("audit", "tail", "-n", "200") if e["subject"] == "JPCP"]
    browser.get(f"{base}/dashboard/confirm?action=promote&model=JPCP")
    assert "lacks the permission 'promote'" in browser.find_element(By.ID, "result").text
    csrf = browser.find_element(By.NAME, "csrf").get_attribute("value")
    status = browser.execute_script(
        "return fetch('/dashboard/actions', {method: 'POST', headers: {'Content-Type': "
        "'application/x-www-form-urlencoded'}, body: 'action=promote&model=JPCP&csrf=' + arguments[0]})"
        ".then(r => r.status)",
        csrf,
    )
    assert status == 403
    assert [e for e in platform.exa("audit", "tail", "-n", "200") if e["subject"] == "JPCP"] == jpcp_moves
    with capsys.disabled():
        print(f"\ndashboard screenshots: {shots}")
