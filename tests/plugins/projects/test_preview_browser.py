"""The live preview in a real browser (headless Chromium over the DevTools pipe), on the API's
host and on a preview host of its own.

The owner is signed in in the browser (the service's own session cookie). The preview page's
scripts run, but in an opaque origin: no cookie or storage of the API's host, the API's
answers unreadable, and the API sees none of the owner's credentials on the script's calls.
The same browser sees a folder served as its index.html, a path out of the tree refused, and,
signed out, the private preview refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from plugins.projects.preview import preview_token
from plugins.projects.records.projects import get_project
from plugins.projects.state import PROJECTS_STATE
from runtime.server import Running
from tests.support import request_log
from tests.support.chromium import chromium
from tests.support.projects import GrantedFeatures, new_project, serve_projects, token_owner

OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
PROBE = """
(async () => {
  const out = {ran: true, origin: self.origin};
  try { out.cookie = document.cookie; } catch (e) { out.cookie = e.name; }
  try { localStorage.setItem("k", "v"); out.storage = "usable"; }
  catch (e) { out.storage = e.name; }
  for (const [name, path] of [["me", "/me"], ["project", "/projects/SLUG"]]) {
    try {
      const answer = await fetch("API" + path + "?from=preview", {credentials: "include"});
      out[name] = await answer.text();
    } catch (e) { out[name] = e.name; }
  }
  try {
    await fetch("API/me?from=preview-no-cors", {credentials: "include", mode: "no-cors"});
  } catch (e) { out.noCors = e.name; }
  document.body.dataset.result = JSON.stringify(out);
})();
"""


def write_tree(running: Running, project_id: str, slug: str, api: str = "") -> None:
    """A folder ``app`` whose page runs the probe, which calls the API at ``api`` (default:
    the page's own host)."""
    root = running.service.state(PROJECTS_STATE).project_workspace(int(project_id))
    (root / "app").mkdir(parents=True)
    (root / "app" / "index.html").write_text(
        "<!doctype html><html><head><title>Preview</title><script src='probe.js'></script>"
        "</head><body><h1>Hello</h1></body></html>")
    (root / "app" / "probe.js").write_text(PROBE.replace("SLUG", slug).replace("API", api))


async def private_token(running: Running, slug: str) -> str:
    project = await running.service.db.read(get_project, slug)
    assert project is not None and project.private
    return preview_token(running.service.settings.jwt.secret, project)


async def test_preview_scripts_run_without_the_owners_credentials(tmp_path: Path) -> None:
    plugins = json.dumps(["auth", "chain", "projects", request_log.MODULE])
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              extra_env={"FLOWSVC_PLUGINS_ENABLED": plugins}) as running:
        log = running.service.state(request_log.REQUEST_LOG)
        async with token_owner(running, "luigi") as http:
            user_id = int((await http.get("/me")).json()["user"]["id"])
            running.service.pm.register(GrantedFeatures({user_id: {"privateProjects": True}}))
            project = await new_project(http, "luigi", private=True)
            slug = project["slug"]
            write_tree(running, project["id"], slug)
            token = await private_token(running, slug)
            [session] = [cookie for cookie in http.cookies.jar]
            async with chromium(tmp_path / "profile", OFFLINE) as browser:
                await browser.call("Network.setCookie", {
                    "name": session.name, "value": session.value,
                    "url": running.base_url, "httpOnly": True, "sameSite": "Lax"})
                await browser.navigate(f"{running.base_url}/me")
                me = json.loads(await browser.evaluate("document.body.innerText"))
                assert me["user"]["id"] == str(user_id)  # signed in, in this browser

                await browser.navigate(f"{running.base_url}/projects/{slug}/preview/app")
                result = json.loads(await browser.wait_for("document.body.dataset.result"))
                seen = list(log)
                # The folder served its index.html.
                assert await browser.evaluate("document.querySelector('h1').textContent") \
                    == "Hello"
                # A path out of the tree is refused, whatever the browser makes of it.
                await browser.navigate(f"{running.base_url}/projects/{slug}/preview/~{token}/"
                                       "..%2f..%2f..%2fsecrets.json")
                refused = await browser.evaluate("document.body.innerText")
                assert json.loads(refused)["error"]["code"] == "not_found"
                # Signed out, the private preview is refused.
                await browser.call("Network.clearBrowserCookies")
                await browser.navigate(f"{running.base_url}/projects/{slug}/preview/app/")
                anonymous = await browser.evaluate("document.body.innerText")
                assert json.loads(anonymous)["error"]["code"] == "private_forbidden"
    # The scripts ran, in an opaque origin: no cookie, no storage, no readable API answer.
    assert result == {"ran": True, "origin": "null", "cookie": "SecurityError",
                      "storage": "SecurityError", "me": "TypeError", "project": "TypeError"}
    # The API saw the script's calls (the no-cors one too) without the owner's cookie.
    from_script = [request for request in seen if "from=preview" in request.target]
    assert len(from_script) == 3
    assert not any(request.had_cookie or request.user_id for request in from_script)
    # The owner opened the private preview signed in, and was sent to its capability URL,
    # which alone lets the page's own files load (they come without the cookie too).
    opened = [request for request in seen
              if "/preview/" in request.target and "from=" not in request.target]
    assert [(request.target.split("/preview/")[1], request.user_id) for request in opened] == [
        ("app", int(user_id)), (f"~{token}/app", int(user_id)), (f"~{token}/app/", int(user_id)),
        (f"~{token}/app/probe.js", None)]


async def test_on_a_preview_host_the_page_is_another_site(tmp_path: Path) -> None:
    plugins = json.dumps(["auth", "chain", "projects", request_log.MODULE])
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              extra_env={"FLOWSVC_PLUGINS_ENABLED": plugins},
                              preview_base_url="http://preview.test:8443") as running:
        log = running.service.state(request_log.REQUEST_LOG)
        port = running.base_url.rsplit(":", 1)[1]
        # Every preview host reaches the service, as wildcard DNS would; nothing else resolves.
        rules = (f"--host-resolver-rules=MAP *.preview.test:8443 127.0.0.1:{port}, "
                 "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
        async with token_owner(running, "luigi") as http:
            user_id = int((await http.get("/me")).json()["user"]["id"])
            running.service.pm.register(GrantedFeatures({user_id: {"privateProjects": True}}))
            project = await new_project(http, "luigi", private=True)
            slug = project["slug"]
            write_tree(running, project["id"], slug, api=running.base_url)
            token = await private_token(running, slug)
            [session] = [cookie for cookie in http.cookies.jar]
            async with chromium(tmp_path / "profile", rules) as browser:
                await browser.call("Network.setCookie", {
                    "name": session.name, "value": session.value,
                    "url": running.base_url, "httpOnly": True, "sameSite": "Lax"})
                await browser.navigate(f"{running.base_url}/projects/{slug}/preview/app/")
                result = json.loads(await browser.wait_for("document.body.dataset.result"))
                location = await browser.evaluate("location.href")
    assert location == f"http://p{project['id']}-{token}.preview.test:8443/app/"
    assert result == {"ran": True, "origin": "null", "cookie": "SecurityError",
                      "storage": "SecurityError", "me": "TypeError", "project": "TypeError"}
    from_script = [request for request in log if "from=preview" in request.target]
    assert len(from_script) == 3
    assert not any(request.had_cookie or request.user_id for request in from_script)
