#!/usr/bin/env python3
"""CDK entry point: `npx cdk synth` / `npx cdk deploy`. Every construct is checked by cdk-nag."""

from __future__ import annotations

import json
import os
from pathlib import Path

from aws_cdk import App, Environment, Validations
from cdk_nag import AwsSolutionsChecks

from stacks.ebb_stack import EbbStack


def build_app(outdir: str | None = None) -> App:
    # The CDK CLI passes cdk.json's context in; a plain `python app.py` (tests) reads it here.
    context = json.loads((Path(__file__).with_name("cdk.json")).read_text())["context"]
    app = App(outdir=outdir, context=context) if outdir else App(context=context)
    env = Environment(account=os.environ.get("CDK_DEFAULT_ACCOUNT"), region=os.environ.get("CDK_DEFAULT_REGION"))
    EbbStack(app, app.node.try_get_context("ebb:stackName") or "Ebb", env=env)
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app


if __name__ == "__main__":
    build_app(os.environ.get("CDK_OUTDIR")).synth()
