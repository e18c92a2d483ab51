"""Compute: four functions from one container image, two zip functions with the common layer;
sizes from context, tracing, log retention, and each function's environment as docs/AWS.md lists it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ebb.ports import deployment as names
from stacks.image import image_python
from tests.helpers.infra import ROOT

IMAGE_FUNCTIONS = ("worker", "supervisor", "prepare", "finalize", "predict", "tune")
ZIP_FUNCTIONS = ("validate", "on_failure")
# What the zip functions must run without (docs/AWS.md "Functions").
HEAVY = ("numpy", "torch", "scipy", "redis", "matplotlib", "rich")


def documented_environment() -> dict[str, set[str]]:
    """docs/AWS.md's environment table: function name -> the variables set on it."""
    text = (ROOT / "docs" / "AWS.md").read_text()
    section = text[text.index("## Environment variables") : text.index("## SNS/SQS signal channel")]
    out: dict[str, set[str]] = {name: set() for name in IMAGE_FUNCTIONS + ZIP_FUNCTIONS}
    for variable, functions in re.findall(r"^\| `(\w+)` \|.*\| ([\w ,]+) \|$", section, re.MULTILINE):
        names = out if functions.strip() == "all" else [f.strip() for f in functions.split(",")]
        for name in names:
            out[name].add(variable)
    assert all(out.values()), out
    return out


def zip_asset_dir(synth, name: str):
    key = synth.functions[name]["Code"]["S3Key"]
    return synth.outdir / synth.assets["files"][key.removesuffix(".zip")]["source"]["path"]


def test_four_functions_run_from_one_image_with_their_own_command(default):
    images = default.assets["dockerImages"]
    assert len(images) == 1  # one image asset for all four
    ((image_hash, image),) = images.items()
    assert image["source"]["platform"] == "linux/amd64"
    staged = default.outdir / image["source"]["directory"]
    assert (staged / "Dockerfile").is_file() and (staged / "ebb" / "engine" / "worker.py").is_file()
    for name in IMAGE_FUNCTIONS:
        props = default.functions[name]
        assert props["PackageType"] == "Image"
        module = "ebb.tune.handler" if name == "tune" else f"ebb.aws.handlers.{name}"  # the search's sits in ebb.tune
        assert props["ImageConfig"]["Command"] == [f"{module}.handler"]
        assert image_hash in json.dumps(props["Code"]["ImageUri"])
        assert props["Architectures"] == ["x86_64"]


def test_dockerfile_builds_the_lambda_image_with_cpu_torch():
    dockerfile = (ROOT / "lambda_src" / "Dockerfile").read_text()
    python = image_python(ROOT / "lambda_src")  # every stage FROM the same Lambda Python base
    assert dockerfile.startswith("#") and f"FROM public.ecr.aws/lambda/python:{python}\n" in dockerfile
    assert "dnf install" in dockerfile and "yum" not in dockerfile  # Amazon Linux 2023
    assert re.search(r"pip install .*--index-url https://download.pytorch.org/whl/cpu torch==\S+", dockerfile)
    assert "-r ${LAMBDA_TASK_ROOT}/requirements-image.txt" in dockerfile
    assert "COPY ebb ${LAMBDA_TASK_ROOT}/ebb" in dockerfile
    assert dockerfile.rstrip().endswith('CMD ["ebb.aws.handlers.worker.handler"]')
    requirements = (ROOT / "lambda_src" / "requirements-image.txt").read_text()
    for package in ("numpy", "scipy", "redis", "pydantic", "pyyaml", "matplotlib", "aws-lambda-powertools"):
        assert re.search(rf"^{package}\b", requirements, re.MULTILINE), package
    assert not re.search(r"^torch\b", requirements, re.MULTILINE)  # only from the CPU index


def test_zip_functions_carry_the_light_package_and_the_layer(default):
    runtime = f"python{image_python(ROOT / 'lambda_src')}"  # the image's Python: one interpreter on AWS
    layer_id, layer = default.one("AWS::Lambda::LayerVersion")
    assert layer["CompatibleRuntimes"] == [runtime] and layer["CompatibleArchitectures"] == ["x86_64"]
    layer_dir = (
        default.outdir / default.assets["files"][layer["Content"]["S3Key"].removesuffix(".zip")]["source"]["path"]
    )
    for package in ("pydantic", "pydantic_core", "yaml", "aws_lambda_powertools", "aws_xray_sdk"):
        assert (layer_dir / "python" / package).is_dir(), package
    assert not (layer_dir / "python" / "boto3").exists() and not (layer_dir / "python" / "botocore").exists()
    for name in ZIP_FUNCTIONS:
        props = default.functions[name]
        assert props["Runtime"] == runtime and props["Handler"] == f"ebb.aws.handlers.{name}.handler"
        assert props["Layers"] == [{"Ref": layer_id}]
        code = zip_asset_dir(default, name)
        for kept in (
            "ebb/__init__.py",
            "ebb/spec.py",
            "ebb/cost/model.py",
            "ebb/cost/prices.json",
            "ebb/catalogue.py",
            "ebb/ports/objects.py",
            "ebb/ports/keys.py",
            "ebb/ports/messages.py",
        ):
            assert (code / kept).is_file(), kept
        # Of the engine only its checkpoint layout and the supervisor's typed state (on_failure
        # reads the last complete round's).
        assert sorted(p.name for p in (code / "ebb/engine").iterdir()) == [
            "__init__.py",
            "checkpoint.py",
            "errors.py",
            "state.py",
        ]
        for dropped in (
            "ebb/models",
            "ebb/predict",
            "ebb/autotune",
            "ebb/data",
            "ebb/local",
            "ebb/sparse.py",
            "ebb/cli.py",
            "ebb/flags.py",
            "ebb/stores/redis_store.py",
            "Dockerfile",
            "requirements-image.txt",
        ):
            assert not (code / dropped).exists(), dropped
        assert not list(code.rglob("__pycache__")) and not list(code.rglob("*.so"))


def test_the_image_asset_holds_no_build_output_of_this_machine(default):
    """A locally built kernel or bytecode in the image's build context would change the asset's
    hash on every machine, and every deploy would build and push the image again."""
    (image,) = default.assets["dockerImages"].values()
    staged = default.outdir / image["source"]["directory"]
    assert (ROOT / "lambda_src" / "ebb" / "native" / "kernels.c").is_file()
    assert not [p for p in staged.rglob("*") if p.suffix in (".so", ".pyc") or p.name == "__pycache__"]


@pytest.fixture(scope="module")
def runtime_layer(tmp_path_factory):
    """(interpreter, layer folder): the functions' Python with the staged layer when this machine
    has that Python, else this interpreter with the same requirements staged for it."""
    version = image_python(ROOT / "lambda_src")
    found = shutil.which(f"python{version}") or next(
        (str(p) for p in sorted(Path.home().glob(f".pyenv/versions/{version}*/bin/python{version}"))), None
    )
    if found and subprocess.run([found, "-c", "import sys"], capture_output=True, check=False).returncode == 0:
        return found, ROOT / "layers" / "common" / "python"
    layer = tmp_path_factory.mktemp("layer")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-compile",
            "--target",
            str(layer),
            "-r",
            str(ROOT / "layers" / "requirements-common.txt"),
        ],
        check=True,
        capture_output=True,
    )
    return sys.executable, layer


@pytest.mark.parametrize("name", ZIP_FUNCTIONS)
def test_zip_handlers_import_with_only_their_package_and_the_layer(default, runtime_layer, name):
    code = zip_asset_dir(default, name)
    python, layer = runtime_layer
    script = (
        f"import sys; sys.path[:0] = [{str(code)!r}, {str(layer)!r}]; "
        f"sys.modules.update(dict.fromkeys({HEAVY!r})); "  # importing any of these now raises
        f"import importlib; importlib.import_module('ebb.aws.handlers.{name}')"
    )
    result = subprocess.run(
        [python, "-I", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"AWS_DEFAULT_REGION": "us-east-1", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_environment_is_what_docs_aws_md_lists_for_each_function(default):
    documented = documented_environment()
    for name, props in default.functions.items():
        env = props["Environment"]["Variables"]
        assert set(env) == documented[name], name
        assert env["POWERTOOLS_SERVICE_NAME"] == names.service_name(name)
        assert env["EBB_BUCKET"] == {
            "Ref": next(k for k, v in default.of_type("AWS::S3::Bucket").items() if "LoggingConfiguration" in v)
        }
        assert env["EBB_METRICS_NAMESPACE"] == "Ebb"
        if "EBB_MAX_WORKERS" in env:
            assert env["EBB_MAX_WORKERS"] == "24"
    # Validate prices and checks a job with what the deployment runs it on.
    deployment = json.loads(default.functions["validate"]["Environment"]["Variables"]["EBB_DEPLOYMENT"])
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    assert deployment == {
        "worker_memory_mb": context["ebb:workerMemoryMb"],
        "supervisor_memory_mb": context["ebb:supervisorMemoryMb"],
        "supervisor_timeout_s": context["ebb:supervisorTimeoutSeconds"],
        "arch": "x86_64",
        "worker_reserved": None,
        "supervisor_reserved": None,
        "map": "inline",
        "cache_node_type": "cache.t4g.medium",
        "cache_nodes": 1,
    }


def test_sizes_tracing_and_logs_come_from_context(default, scaled):
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    groups = default.of_type("AWS::Logs::LogGroup")
    for name, props in default.functions.items():
        key = "onFailure" if name == "on_failure" else name
        assert props["MemorySize"] == context[f"ebb:{key}MemoryMb"], name
        assert props["Timeout"] == context[f"ebb:{key}TimeoutSeconds"], name
        assert "ReservedConcurrentExecutions" not in props, name
        # The default VPC has no route to X-Ray (isolated subnets, no xray endpoint): only the
        # functions outside it trace; behind a NAT gateway (scaled) all do.
        assert props.get("TracingConfig") == (None if name in ("worker", "supervisor") else {"Mode": "Active"}), name
        assert scaled.functions[name]["TracingConfig"] == {"Mode": "Active"}, name
        group = props["LoggingConfig"]["LogGroup"]["Ref"]
        assert groups[group]["RetentionInDays"] == context["ebb:logRetentionDays"]
        assert groups[group]["LogGroupName"] == f"/ebb/Ebb/{name.replace('_', '-')}"  # README "Logs"
        expected_tmp = context.get(f"ebb:{key}EphemeralMb", 512) if name in ("prepare", "predict") else 512
        assert props["EphemeralStorage"] == {"Size": expected_tmp}
    worker = scaled.functions["worker"]
    assert worker["MemorySize"] == 3008 and worker["ReservedConcurrentExecutions"] == 64
    assert worker["Environment"]["Variables"]["EBB_MAX_WORKERS"] == "64"


def test_only_the_redis_functions_may_read_the_auth_token(default):
    (secret,) = default.of_type("AWS::SecretsManager::Secret")
    readers = set()
    for name, props in default.functions.items():
        role = props["Role"]["Fn::GetAtt"][0]
        for policy in default.of_type("AWS::IAM::Policy").values():
            if {"Ref": role} in policy["Roles"]:
                for s in policy["PolicyDocument"]["Statement"]:
                    if "secretsmanager:GetSecretValue" in s["Action"] and s["Resource"] == {"Ref": secret}:
                        readers.add(name)
    assert readers == {"worker", "supervisor"}


def test_writes_are_confined_to_the_keys_the_runtime_writes(default):
    """Each role may put and delete exactly the key patterns of ebb.ports.deployment (the rehearsal,
    tests/infra/test_rehearsal.py, shows the runtime needs every one of them)."""
    bucket = next(k for k, v in default.of_type("AWS::S3::Bucket").items() if "LoggingConfiguration" in v)
    writes: dict[str, set[str]] = {}
    deletes: dict[str, set[str]] = {}
    for name, props in default.functions.items():
        role = props["Role"]["Fn::GetAtt"][0]
        for policy in default.of_type("AWS::IAM::Policy").values():
            if {"Ref": role} not in policy["Roles"]:
                continue
            for s in policy["PolicyDocument"]["Statement"]:
                actions = [s["Action"]] if isinstance(s["Action"], str) else s["Action"]
                for action, found in (("s3:PutObject", writes), ("s3:DeleteObject*", deletes)):
                    if action not in actions:
                        continue
                    resources = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
                    for r in resources:
                        if r == {"Fn::GetAtt": [bucket, "Arn"]}:
                            continue  # the bucket itself (List, GetBucket* share the statement): no objects
                        arn, suffix = r["Fn::Join"][1]
                        assert arn == {"Fn::GetAtt": [bucket, "Arn"]}
                        found.setdefault(name, set()).add(suffix.removeprefix("/"))
    assert writes == {name: set(patterns) for name, patterns in names.PUT.items()}
    assert deletes == {name: set(patterns) for name, patterns in names.DELETE.items()}
    assert writes["supervisor"] == {"checkpoints/*", "scratch/*", "jobs/*/progress.json"}
    assert writes["validate"] == {"jobs/*/spec.json"}
