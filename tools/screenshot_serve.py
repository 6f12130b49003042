"""The README's picture of the `vitlab serve` page: serve a run, upload an image in headless Chromium (selenium +
chromedriver), save a screenshot.

    python tools/screenshot_serve.py runs/demo my_digit.png docs/figures/serve.png
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait


def main(run: str, image: str, out: str) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "vitlab", "serve", run, "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    port = re.search(r"127\.0\.0\.1:(\d+)", server.stdout.readline()).group(1)
    time.sleep(2)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1000,640"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        driver.find_element(By.ID, "file").send_keys(str(__import__("pathlib").Path(image).resolve()))
        WebDriverWait(driver, 30).until(
            lambda d: d.execute_script(
                "const o = document.getElementById('overlay'); return o.complete && o.naturalWidth > 0"
            )
        )
        driver.save_screenshot(out)
    finally:
        driver.quit()
        server.send_signal(signal.SIGTERM)
        server.wait(60)


if __name__ == "__main__":
    main(*sys.argv[1:4])
