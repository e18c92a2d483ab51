"""The worker image builds: every package of lambda_src/Dockerfile resolves as a binary wheel for
exactly its base image's Python and platform tags (read from its FROM, stacks/image.py), for
both architectures. pip resolves against the package registry, as the image's build does;
the Python 3.11 base (Amazon Linux 2, glibc 2.26), on which the image could not be built,
fails the same check."""

from __future__ import annotations

import json

from stacks.image import image_python, torch_pin, wheel_platforms
from tests.helpers.infra import ROOT


def _installed(folder) -> dict[str, str]:
    """name -> the file pip would install, from the reports of one check."""
    out = {}
    for report in folder.glob("*.json"):
        for item in json.loads(report.read_text())["install"]:
            out[item["metadata"]["name"].lower().replace("_", "-")] = item["download_info"]["url"].rsplit("/", 1)[-1]
    return out


def test_every_package_of_the_image_installs_as_a_wheel_on_its_base(wheel_checks):
    python = image_python(ROOT / "lambda_src")
    tag = "cp" + python.replace(".", "")
    for arch in ("x86_64", "arm64"):
        for process, _ in wheel_checks[arch]:
            output, _ = process.communicate(timeout=300)
            assert process.returncode == 0, f"{arch}: {output[-3000:]}"
        installed = _installed(wheel_checks[arch][0][1])
        for name in ("torch", "numpy", "scipy", "redis", "pydantic", "pyyaml", "matplotlib", "aws-lambda-powertools"):
            assert name in installed, (arch, name)
        assert all(f.endswith(".whl") for f in installed.values()), installed
        assert installed["torch"].startswith(f"torch-{torch_pin(ROOT / 'lambda_src')}-{tag}-{tag}-")
        # Each compiled wheel is for this architecture and a glibc the base has.
        allowed = set(wheel_platforms(python, arch))
        for name in ("torch", "numpy", "scipy", "pydantic-core"):
            platforms = installed[name].removesuffix(".whl").split("-")[-1].split(".")
            assert allowed & set(platforms), (arch, installed[name])

    ((process, _),) = wheel_checks["python3.11"]
    output, _ = process.communicate(timeout=300)
    assert process.returncode != 0 and "torch" in output, output[-2000:]
