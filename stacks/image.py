"""The functions' base: the Lambda Python base image of `lambda_src/Dockerfile`, read from its `FROM`.

The Python version is written once, in that `FROM`: the zip functions' runtime and their
layer (scripts/build_layer.sh) follow it, and the infra tests resolve every package of the
image as wheels for exactly its platform (tests/infra/test_image.py). Without the engine's
or the CDK's dependencies, so that scripts can run it:

    python -m stacks.image [--arch x86_64|arm64]   # prints the Python version, then the wheel platforms
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

BASE = "public.ecr.aws/lambda/python"
# The Lambda Python base images: the Amazon Linux under each, by its glibc. 3.9 to 3.11
# are Amazon Linux 2 (glibc 2.26, yum); 3.12 and later Amazon Linux 2023 (glibc 2.34, dnf).
GLIBC = {"3.9": 26, "3.10": 26, "3.11": 26, "3.12": 34, "3.13": 34, "3.14": 34}
MACHINES = {"x86_64": "x86_64", "arm64": "aarch64"}
_FROM = re.compile(r"^FROM\s+(\S+)", re.MULTILINE)
_TORCH = re.compile(r"\btorch==(\S+)")
# What the CPU build of torch depends on (PyPI's torch is the CUDA build, which adds nvidia-*).
TORCH_CPU_DEPENDENCIES = ("filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec")


class ImageError(ValueError):
    """The Dockerfile's base is not a Lambda Python base image this file knows."""


def image_base(lambda_src: Path) -> str:
    """The `FROM` image of every stage (one image: the build stages use the same base)."""
    dockerfile = Path(lambda_src) / "Dockerfile"
    bases = set(_FROM.findall(dockerfile.read_text()))
    if len(bases) != 1:
        raise ImageError(f"{dockerfile}: every stage should start FROM the same base image, found {sorted(bases)}")
    return bases.pop()


def image_python(lambda_src: Path) -> str:
    """The Python version of the image's base (`3.12` for `public.ecr.aws/lambda/python:3.12`)."""
    base = image_base(lambda_src)
    name, _, tag = base.partition(":")
    version = re.match(r"\d+\.\d+", tag)
    if name != BASE or version is None or version.group() not in GLIBC:
        raise ImageError(
            f"lambda_src/Dockerfile: FROM {base} is not one of the Lambda Python base images "
            f"{BASE}:{{{','.join(GLIBC)}}}"
        )
    return version.group()


def wheel_platforms(python: str, architecture: str) -> list[str]:
    """Every wheel platform tag the base image's glibc accepts, newest first: pip takes each
    `--platform` literally, so all of them are passed."""
    machine, newest = MACHINES[architecture], GLIBC[python]
    oldest = 17 if machine == "aarch64" else 5  # aarch64 wheels start at manylinux2014
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(newest, oldest - 1, -1)]
    legacy = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
    return tags + [f"{name}_{machine}" for name, minor in legacy.items() if oldest <= minor <= newest]


def torch_pin(lambda_src: Path) -> str:
    """The torch version the Dockerfile installs."""
    found = _TORCH.search((Path(lambda_src) / "Dockerfile").read_text())
    if found is None:
        raise ImageError("lambda_src/Dockerfile installs no torch==VERSION")
    return found.group(1)


def wheel_resolution(
    lambda_src: Path, architecture: str, report_dir: Path, python: str | None = None
) -> list[list[str]]:
    """The pip dry runs that resolve every package of the image as wheels for exactly the base's
    Python and platform tags (a pin or a base without wheels fails them, as it would fail the
    image's build): torch alone, then requirements-image.txt with torch's CPU dependencies.
    Each writes pip's JSON report into `report_dir`. `python` overrides the base's (to show
    that another base fails)."""
    lambda_src = Path(lambda_src)
    python = python or image_python(lambda_src)
    common = [
        "--dry-run",
        "--quiet",
        "--disable-pip-version-check",
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--target",
        str(Path(report_dir) / "target"),
    ]
    for platform in wheel_platforms(python, architecture):
        common += ["--platform", platform]
    return [
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            *common,
            "--no-deps",
            "--report",
            str(Path(report_dir) / "torch.json"),
            f"torch=={torch_pin(lambda_src)}",
        ],
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            *common,
            "--report",
            str(Path(report_dir) / "packages.json"),
            "-r",
            str(lambda_src / "requirements-image.txt"),
            *TORCH_CPU_DEPENDENCIES,
        ],
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=sorted(MACHINES), default="x86_64")
    args = parser.parse_args(argv)
    python = image_python(Path(__file__).resolve().parents[1] / "lambda_src")
    print(python)
    print(" ".join(wheel_platforms(python, args.arch)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
