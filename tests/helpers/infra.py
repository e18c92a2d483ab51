"""Helpers of the infrastructure tests: synthesise a variant of the app and read its template."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

# Synthesised for a region and account, as every real deploy is: the names in cdk-nag's
# findings (which its acknowledgements must match) change with them. The availability
# zones are what `cdk deploy` looks up and keeps in cdk.context.json.
SCALED_ENV = {"region": "eu-west-1", "account": "111122223333"}
SCALED = {
    "ebb:maxWorkers": 64,
    "ebb:egress": "nat",
    "ebb:cacheShards": 2,
    "ebb:cacheReplicas": 1,
    "ebb:workerReservedConcurrency": 64,
    "ebb:workerMemoryMb": 3008,
    "ebb:retainData": True,
    "availability-zones:account=111122223333:region=eu-west-1": ["eu-west-1a", "eu-west-1b", "eu-west-1c"],
}
# Also: a data bucket kept from an earlier deployment, imported rather than created.
KEPT_BUCKET = "ebb-data-kept"
SERVERLESS = {
    "ebb:cache": "serverless",
    "ebb:cacheEngine": "valkey",
    "ebb:cacheServerlessMaxGb": 2,
    "ebb:dataBucketName": KEPT_BUCKET,
}
SERVERLESS_ENV = {"region": "ap-southeast-2"}


def resolve(value) -> str:
    """A template string value with every intrinsic replaced by a readable placeholder: <Ref:X>, <X.Arn>."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join(resolve(p) for p in parts)
    if isinstance(value, dict) and "Ref" in value:
        return f"<Ref:{value['Ref']}>"
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return "<{}.{}>".format(*value["Fn::GetAtt"])
    if isinstance(value, dict) and "Fn::Select" in value:
        index, source = value["Fn::Select"]
        return f"<Select:{index}:{json.dumps(source, sort_keys=True)}>"
    return f"<{json.dumps(value, sort_keys=True)}>"


class UnresolvedError(KeyError):
    """The template refers to something the resolver was given no value for."""

    def __str__(self) -> str:
        return str(self.args[0])


_SUB_VARIABLE = re.compile(r"\$\{([^}!][^}]*)\}")


def resolve_intrinsics(value, refs: Mapping[str, object], attributes: Mapping[tuple[str, str], object]):
    """`value` (any template fragment) with its intrinsics evaluated as CloudFormation would:
    ``Ref`` from `refs` (logical id or pseudo parameter -> value), ``Fn::GetAtt`` from
    `attributes` ((logical id, attribute) -> value), and ``Fn::Join``, ``Fn::Select``,
    ``Fn::Split``, ``Fn::Sub`` on what those give. A reference missing from both, or another
    intrinsic, raises UnresolvedError naming it."""

    def ref(name: str):
        if name not in refs:
            raise UnresolvedError(f"Ref {name}: no value for it (a resource or pseudo parameter not created here)")
        return refs[name]

    def get_att(logical_id: str, attribute: str):
        if (logical_id, attribute) not in attributes:
            raise UnresolvedError(f"Fn::GetAtt {logical_id}.{attribute}: no value for it")
        return attributes[(logical_id, attribute)]

    def sub(template: str, variables: Mapping[str, object]) -> str:
        def one(match: re.Match) -> str:
            name = match.group(1)
            if name in variables:
                return str(variables[name])
            if "." in name and not name.startswith("AWS::"):
                return str(get_att(*name.split(".", 1)))
            return str(ref(name))

        return _SUB_VARIABLE.sub(one, template).replace("${!", "${")

    def walk(v):
        if isinstance(v, list):
            return [walk(x) for x in v]
        if not isinstance(v, dict):
            return v
        if len(v) == 1:
            ((key, arg),) = v.items()
            if key == "Ref":
                return ref(arg)
            if key == "Fn::GetAtt":
                logical_id, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
                return get_att(logical_id, attribute)
            if key == "Fn::Join":
                separator, parts = arg
                return separator.join(str(p) for p in walk(parts))
            if key == "Fn::Select":
                index, items = arg
                return walk(items)[int(walk(index))]
            if key == "Fn::Split":
                separator, text = arg
                return walk(text).split(separator)
            if key == "Fn::Sub":
                template, variables = (arg, {}) if isinstance(arg, str) else (arg[0], walk(arg[1]))
                return sub(template, variables)
            if key.startswith("Fn::") or key == "Condition":
                raise UnresolvedError(f"{key}: not evaluated here ({json.dumps(arg)[:200]})")
        return {k: walk(x) for k, x in v.items()}

    return walk(value)


@dataclass
class Synthesis:
    """One synthesised variant: the template, the cloud assembly folder, and helpers to read them."""

    template: dict
    outdir: Path
    context: dict = field(default_factory=dict)
    region: str | None = None  # None: environment-agnostic
    account: str | None = None
    lint: subprocess.Popen | None = None  # cfn-lint on the template, started right after synthesis

    @cached_property
    def assertions(self):
        from aws_cdk.assertions import Template

        return Template.from_json(self.template)

    @property
    def resources(self) -> dict[str, dict]:
        return self.template["Resources"]

    def of_type(self, type_: str) -> dict[str, dict]:
        """Logical id -> Properties of every resource of `type_`."""
        return {k: v.get("Properties", {}) for k, v in self.resources.items() if v["Type"] == type_}

    def one(self, type_: str) -> tuple[str, dict]:
        found = self.of_type(type_)
        assert len(found) == 1, f"expected one {type_}, found {sorted(found)}"
        return next(iter(found.items()))

    def machine(self, construct: str = "Workflow") -> tuple[str, dict]:
        """The training state machine (``Workflow``), or the ``Predict`` or ``Tune`` one: logical id, properties."""
        found = {k: v for k, v in self.of_type("AWS::StepFunctions::StateMachine").items() if k.startswith(construct)}
        assert len(found) == 1, f"expected one {construct} state machine, found {sorted(found)}"
        return next(iter(found.items()))

    @cached_property
    def functions(self) -> dict[str, dict]:
        """Properties of each Lambda function, by handler module name (worker, ..., on_failure, tune)."""
        out = {}
        for props in self.of_type("AWS::Lambda::Function").values():
            handler = props.get("Handler") or props["ImageConfig"]["Command"][0]
            if handler.startswith("ebb.aws.handlers."):  # not CDK's own (the buckets' auto-delete)
                out[handler.split(".")[-2]] = props
            elif handler == "ebb.tune.handler.handler":  # the search's handler sits in ebb.tune
                out["tune"] = props
        return out

    def function_id(self, name: str) -> str:
        return next(k for k, v in self.of_type("AWS::Lambda::Function").items() if v is self.functions[name])

    @cached_property
    def definition(self) -> dict:
        """The training state machine's ASL, with ARNs as placeholders."""
        _, props = self.machine()
        return json.loads(resolve(props["DefinitionString"]))

    @cached_property
    def predict_definition(self) -> dict:
        """The Predict state machine's ASL, with ARNs as placeholders."""
        _, props = self.machine("Predict")
        return json.loads(resolve(props["DefinitionString"]))

    @cached_property
    def tune_definition(self) -> dict:
        """The Tune state machine's ASL, with ARNs as placeholders."""
        _, props = self.machine("Tune")
        return json.loads(resolve(props["DefinitionString"]))

    @cached_property
    def dashboard(self) -> dict:
        _, props = self.one("AWS::CloudWatch::Dashboard")
        return json.loads(resolve(props["DashboardBody"]))

    @cached_property
    def assets(self) -> dict:
        return json.loads((self.outdir / "Ebb.assets.json").read_text())

    @cached_property
    def metadata(self) -> dict:
        return json.loads((self.outdir / "Ebb.metadata.json").read_text())


def synthesise(outdir: Path, context: dict | None = None, *, lint: bool = False, **kwargs) -> Synthesis:
    """Synthesise the app into `outdir`; with `lint`, start cfn-lint on the template in the background
    (from the repository root, so it reads .cfnlintrc.yaml)."""
    from app import build_app

    assembly = build_app(str(outdir), context=context, **kwargs).synth()
    synth = Synthesis(
        assembly.get_stack_by_name("Ebb").template,
        outdir,
        dict(context or {}),
        kwargs.get("region"),
        kwargs.get("account"),
    )
    if lint:
        cfn_lint = "import sys; from cfnlint.runner import main; sys.exit(main())"  # the cfn-lint command
        synth.lint = subprocess.Popen(
            [sys.executable, "-c", cfn_lint, str(outdir / "Ebb.template.json")],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return synth


def cdk_cli_synth(outdir: Path) -> subprocess.Popen:
    """`npx cdk synth` of the app into `outdir`, offline: the pinned CLI runs app.py as cdk.json says."""
    env = {
        **os.environ,
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        "CDK_DISABLE_VERSION_CHECK": "1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for var in ("CDK_DEFAULT_ACCOUNT", "CDK_DEFAULT_REGION", "CDK_OUTDIR", "CDK_CONTEXT_JSON"):
        env.pop(var, None)
    return subprocess.Popen(
        ["npx", "--no-install", "cdk", "synth", "--quiet", "--no-notices", "-o", str(outdir)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
