"""What the page tests of `vitlab serve` share: a headless Chromium."""

import shutil

import pytest


@pytest.fixture
def chromium():
    """A headless Chromium driven through selenium and chromedriver (skipped where they are not installed)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not browser or not driver_path:
        pytest.skip(
            "Chromium and its driver are not installed (apt-get install chromium chromium-driver; "
            ".ci/run installs them)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1000,800",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    yield driver
    driver.quit()
