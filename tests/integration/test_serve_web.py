"""The serving page in a real headless browser (Debian's chromium + selenium, installed by
scripts/browser_engine.sh; a system test: CRYPTEN_LITE_SYSTEM_TESTS=1).

A digit is drawn with the mouse; the page secret-shares it in the browser and sends one
share to each server over HTTP (CORS limited to the page's origin). The prediction it shows
equals torch's forward on the exact input the page shared, and what each server received
is a share that is not the image (the shares add up to it; each alone is uniform noise)."""

from __future__ import annotations

import base64
import json
import pathlib
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
import torch

from serve_service import ROOT, Service
from crypten_lite.serve.server import build_model

pytestmark = pytest.mark.system_tests("installs Debian's chromium and chromium-driver with "
                                      "apt-get and selenium with pip (scripts/browser_engine.sh)")
TOL = 2e-2
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--disable-gpu", "--disable-quic", "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def browser():
    out = subprocess.run(["bash", str(ROOT / "scripts" / "browser_engine.sh")], capture_output=True,
                         text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService
    opts = webdriver.ChromeOptions()
    opts.binary_location = out.stdout.strip().splitlines()[-1]
    profile = tempfile.mkdtemp(prefix="crypten-lite-chromium-")
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=DriverService(executable_path="/usr/bin/chromedriver"), options=opts)
    driver.set_script_timeout(300)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def test_page_predicts_privately(tmp_path, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    svc = Service(tmp_path / "state", "--model", "lenet", "--web")
    try:
        browser.get(f"{svc.conn['web']}/#token={svc.conn['token']}")
        WebDriverWait(browser, 300).until(lambda d: d.execute_script("return window.pageReady === true"))
        # record what the page sends to each server
        browser.execute_script("""
            window.sent = []; const real = window.fetch;
            window.fetch = (url, init) => { if (init && init.body) window.sent.push([url, init.body]);
                                            return real(url, init); };""")
        pad = browser.find_element(By.ID, "pad")
        ActionChains(browser).move_to_element_with_offset(pad, -40, -90).click_and_hold() \
            .move_by_offset(0, 60).move_by_offset(0, 60).move_by_offset(0, 60).release().perform()
        browser.find_element(By.ID, "predict").click()
        WebDriverWait(browser, 300).until(
            lambda d: d.execute_script("return window.lastResult || window.lastError || null"))
        assert browser.execute_script("return window.lastError || null") is None
        result = browser.execute_script("return window.lastResult")
        x = np.array(result["input"]).reshape(1, 1, 28, 28)
        assert x.max() > 0.5 and (x == 0).mean() > 0.5          # the stroke, on black
        model, _ = build_model("lenet")
        with torch.no_grad():
            want = model(torch.tensor(x, dtype=torch.float32)).numpy()[0]
        np.testing.assert_allclose(result["logits"], want, atol=TOL)
        assert result["pred"] == int(np.argmax(want))
        shown = browser.find_element(By.ID, "pred").text
        assert shown == str(result["pred"])
        # neither server saw the image: each received one uniform-looking share of it
        sent = browser.execute_script("return window.sent")
        assert len(sent) == 2 and {u.rsplit("/", 1)[0] for u, _ in sent} == set(svc.conn["web_endpoints"])
        enc = np.round(x * 2 ** 16).astype(np.int64).view(np.uint64).ravel()
        shares = [np.frombuffer(base64.b64decode(json.loads(b)["components"][0]), dtype="<u8") for _, b in sent]
        total = np.zeros_like(enc)
        for s in shares:
            total += s
            assert not np.array_equal(s, enc)
            assert (s == 0).mean() < 0.01                     # the image is mostly zeros; a share is not
        assert np.array_equal(total, enc)
    except BaseException:
        print(svc.output())
        raise
    finally:
        svc.stop()
