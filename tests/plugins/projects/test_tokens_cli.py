"""``flowsvc tokens``: the operators' way to register the tokens projects attach to."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.cli import main
from tests.support.projects import projects_env


def test_tokens_add_update_and_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # no config.toml: defaults and the environment only
    for name, value in projects_env(tmp_path / "var",
                                    database_url=f"sqlite:///{tmp_path / 'db.sqlite'}").items():
        monkeypatch.setenv(name, value)
    owner, instance = "0x" + "Ab" * 20, "0x" + "12" * 20
    add = ["tokens", "add", "moon", "--owner", owner, "--template", "virtuals",
           "--chain-id", "56", "--instance", instance]
    assert main(add) == 0
    assert capsys.readouterr().out == f"added moon owned by {owner.lower()}\n"
    assert main([*add[:4], "0x" + "cd" * 20, *add[5:]]) == 0
    assert capsys.readouterr().out.startswith("updated moon owned by 0xcdcd")
    assert main(["tokens", "add", "Bad Slug", *add[3:]]) == 2
    assert "lowercase letters" in capsys.readouterr().out
    assert main(["tokens", "list"]) == 0
    assert capsys.readouterr().out == f"moon\t0x{'cd' * 20}\tvirtuals\t56\t{instance}\n"
