"""The image `make image` builds is the chart's default, at the package's version: one version,
pyproject.toml's, is the wheel's, ``reins --version``'s, the image's tag and the chart's
appVersion (the chart's default tag). Fast: no image is built here (tests/ops/test_image.py
builds and runs it)."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import yaml

from tests.ops.chart import CHART, ROOT, needs_helm
from tests.ops.image import image_name
from tests.ops.test_helm import images, render

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_charts_app_version_is_the_packages() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION, "bump Chart.yaml's appVersion with pyproject.toml"


def test_make_image_tags_the_charts_image_at_the_packages_version() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert image_name() == f"{values['image']['repository']}:{VERSION}"


@needs_helm
def test_every_container_the_chart_renders_runs_the_image_make_image_builds() -> None:
    rendered = images(render())
    assert rendered and set(rendered.values()) == {image_name()}, rendered


def test_reins_version_prints_the_packages_version() -> None:
    code = "from ops.cli.main import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code, "--version"], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, f"reins {VERSION}\n"), done.stderr
