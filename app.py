#!/usr/bin/env python3
"""CDK entry point: `npx cdk synth` / `npx cdk deploy`. Every construct is checked by cdk-nag."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import App, Environment, Validations
from cdk_nag import AwsSolutionsChecks

from stacks.ebb_stack import EbbStack
from stacks.settings import Settings

ROOT = Path(__file__).resolve().parent
LAMBDA_SRC = ROOT / "lambda_src"
LAYER_DIR = ROOT / "layers" / "common"


def build_app(
    outdir: str | None = None,
    *,
    context: Mapping[str, Any] | None = None,
    layer_dir: Path = LAYER_DIR,
    region: str | None = None,
    account: str | None = None,
) -> App:
    """The app with cdk.json's context, overridden by `context` (tests) and by `-c` (the CLI).
    The stack's region and account: `region` and `account`, else the CLI's (CDK_DEFAULT_REGION,
    CDK_DEFAULT_ACCOUNT), else none (an environment-agnostic template)."""
    # The CDK CLI passes cdk.json's context in; a plain `python app.py` (tests) reads it here.
    defaults = json.loads((ROOT / "cdk.json").read_text())["context"]
    app = App(outdir=outdir, context={**defaults, **(context or {})})
    settings = Settings.from_context(app.node.try_get_context)
    env = Environment(
        account=account or os.environ.get("CDK_DEFAULT_ACCOUNT"), region=region or os.environ.get("CDK_DEFAULT_REGION")
    )
    EbbStack(
        app,
        settings.stack_name,
        settings=settings,
        lambda_src=LAMBDA_SRC,
        layer_dir=layer_dir,
        env=env,
        description="Ebb: sparse ML training on a shrinking fleet of Lambda workers",
    )
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app


if __name__ == "__main__":
    build_app(os.environ.get("CDK_OUTDIR")).synth()
