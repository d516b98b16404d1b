"""The chat page at ``/`` in headless Chromium (Debian's chromium + chromium-driver, driven by Selenium)."""

from __future__ import annotations

import shutil

import pytest

from polyturn.serve.app import create_app
from polyturn.serve.service import ServeConfig
from tests.serve.conftest import RunningServer

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver "
                                "(make test installs them with apt-get when it can)")


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    drv.set_page_load_timeout(30)
    yield drv
    drv.quit()


@pytest.mark.slow
def test_chat_page_talks_to_the_agent_and_shows_tool_calls(browser, checkpoints, data_dir):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    cfg = ServeConfig(checkpoints=[str(checkpoints[0])], data_dir=str(data_dir))
    with RunningServer(create_app(cfg)) as srv:
        b = browser
        b.get(srv.url + "/")
        wait = WebDriverWait(b, 20)
        b.find_element(By.ID, "open").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "status"), "on v1"))
        b.find_element(By.ID, "text").send_keys("hello")
        b.find_element(By.ID, "send").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "log"), "Action: list_tables"))
        assert "you: hello" in b.find_element(By.ID, "log").text
        # An environment session: the server runs the tool and the page shows the call and its result.
        Select(b.find_element(By.ID, "kind")).select_by_value("env")
        b.find_element(By.ID, "open").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "log"), "task: "))
        b.find_element(By.ID, "step").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "log"), "[list_tables] Tables:"))
        assert not b.find_elements(By.CSS_SELECTOR, ".err")
        assert len(srv.app.state.service.store) == 1  # the chat session was closed when the second opened


@pytest.mark.slow
@pytest.mark.xdist_group("serve_hierarchy")  # with the hierarchical serving tests: one process trains the checkpoint
def test_chat_page_shows_a_hierarchical_sessions_subgoal(browser, hierarchical_ckpt):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    cfg = ServeConfig(checkpoints=[str(hierarchical_ckpt)])
    with RunningServer(create_app(cfg)) as srv:
        b = browser
        b.get(srv.url + "/")
        wait = WebDriverWait(b, 20)
        Select(b.find_element(By.ID, "kind")).select_by_value("env")
        b.find_element(By.ID, "seed").clear()
        b.find_element(By.ID, "seed").send_keys("1")
        b.find_element(By.ID, "open").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "goal"), "subgoal 1 (set by the manager): inspect"))
        b.find_element(By.ID, "step").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "log"), "[list_tables] Tables:"))
        b.find_element(By.ID, "step").click()  # subgoal_done: the manager sets the second subgoal
        wait.until(ec.text_to_be_present_in_element((By.ID, "goal"), "subgoal 2 (set by the manager): inspect"))
        assert "[subgoal_done] Subgoal: Inspect the schema" in b.find_element(By.ID, "log").text
        assert not b.find_elements(By.CSS_SELECTOR, ".err")
