"""The billing clock: the test clock moves only outside production, through the internal
endpoint, and a production deployment that asks for it does not start."""

from __future__ import annotations

from pathlib import Path

from tests.support.billing import DAY, INTERNAL, billing_env
from tests.support.processes import run_flowsvc
from tests.support.server import client, free_port, make_settings, running_server


def test_a_production_deployment_refuses_the_test_clock(tmp_path: Path) -> None:
    env = billing_env(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                      extra={"FLOWSVC_SERVICE_ENVIRONMENT": "production"})
    code, output = run_flowsvc(env, "serve", "--bind", f"127.0.0.1:{free_port()}")
    assert code == 2, output
    assert "test_clock = true is refused when [service] environment is \"production\"" in output
    assert "Traceback" not in output  # one line naming it, like every configuration error


async def test_the_internal_endpoint_moves_the_test_clock_only(tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    system = billing_env(tmp_path / "var", database_url,
                         extra={"FLOWSVC_PLUGINS_BILLING_TEST_CLOCK": "false"})
    async with running_server(make_settings(system), system) as running, \
            client(running) as http:
        refused = await http.post("/internal/billing/clock", headers=INTERNAL,
                                  json={"advanceSeconds": DAY})
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
        assert (await http.get("/internal/billing/clock", headers=INTERNAL)).json()[
            "offsetSeconds"] == 0
    env = billing_env(tmp_path / "var", database_url)
    async with running_server(make_settings(env), env) as running, client(running) as http:
        anonymous = await http.post("/internal/billing/clock", json={"advanceSeconds": DAY})
        assert anonymous.status_code == 401
        backwards = await http.post("/internal/billing/clock", headers=INTERNAL,
                                    json={"advanceSeconds": -1})
        assert backwards.status_code == 400
        moved = await http.post("/internal/billing/clock", headers=INTERNAL,
                                json={"advanceSeconds": DAY})
        assert moved.status_code == 200 and moved.json()["offsetSeconds"] == DAY
        again = await http.post("/internal/billing/clock", headers=INTERNAL,
                                json={"advanceSeconds": DAY})
        assert again.json()["offsetSeconds"] == 2 * DAY
