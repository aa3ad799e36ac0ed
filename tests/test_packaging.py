"""Installation: the wheel carries the presets, the console script runs from any directory, and
`memory`, `estimate`, `plan` and `launch` never import torch."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def test_wheel_ships_presets(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"presets/gpus.toml", "presets/clusters.toml", "presets/models/llama.toml"} <= names
    assert "planner/cli.py" in names and "cost_models/memory.py" in names


def _planner(*args: str, cwd: Path, importtime: bool = False) -> subprocess.CompletedProcess:
    flags = ["-X", "importtime"] if importtime else []
    code = "import sys; from planner.cli import main; sys.argv = ['planner'] + sys.argv[1:]; main()"
    return subprocess.run([sys.executable, *flags, "-c", code, *args], cwd=cwd, capture_output=True, text=True)


@pytest.mark.parametrize("command", ["memory", "estimate"])
def test_runs_from_any_directory_without_torch(tmp_path, command):
    result = _planner(command, "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--json", cwd=tmp_path, importtime=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["model"]["params_total"] == 8_030_261_248
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert not any(m == "torch" or m.startswith("torch.") for m in imported)


def test_usage_errors_are_one_line(tmp_path):
    result = _planner("memory", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "eight", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--gpus" in result.stderr


def test_help_does_not_load_the_cost_model(tmp_path):
    result = _planner("--help", cwd=tmp_path, importtime=True)
    assert result.returncode == 0
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "pydantic" not in imported and "cost_models.memory" not in imported


def test_plan_runs_without_torch(tmp_path):
    result = _planner("plan", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "64",
                      "--top", "2", "--json", cwd=tmp_path, importtime=True)
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["plans"]) == 2
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert not any(m == "torch" or m.startswith("torch.") for m in imported)


def test_launch_runs_without_torch(tmp_path):
    result = _planner("launch", "llama-3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch-size", "64",
                      "--out", str(tmp_path / "out"), cwd=tmp_path, importtime=True)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["rank"] == 1
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert not any(m == "torch" or m.startswith("torch.") for m in imported)


def test_every_package_is_in_the_wheel():
    """pyproject lists its packages by hand: a new subpackage missing from the list would leave
    `pip install .` without it."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(root).parts)
        for top in ("planner", "cost_models", "presets")
        for p in (root / top).rglob("__init__.py")
    }
    assert found <= listed, found - listed
