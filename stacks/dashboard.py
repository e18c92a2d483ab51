"""Dashboard: one CloudWatch dashboard per deployment, and the alarms that reach users.

The top rows show one job, picked with the dashboard's "Job" variable (a property
variable on the `JobId` dimension of the job metrics, docs/AWS.md "Metrics"); the rows
below show the deployment: functions, cache, queues and executions. Alarms on failed
executions and on dead letters publish to the events topic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import Aws, Duration, Fn
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from ebb.ports.deployment import JOB_DIMENSION, METRICS_NAMESPACE, PREDICT_DIMENSION, TUNE_DIMENSION
from stacks.cache import Cache

# The dimension value the job widgets are drawn with; the "Job" variable replaces it.
JOB_PLACEHOLDER = "select-a-job"
PERIOD = Duration.minutes(1)


class Dashboard(Construct):
    """`dashboard`, `failed_executions_alarm` and `dead_letters_alarm` after construction."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        functions: Mapping[str, lambda_.IFunction],
        cache: Cache,
        supervisor_queue: sqs.IQueue,
        worker_queues: Sequence[sqs.IQueue],
        dead_letters: sqs.IQueue,
        state_machine: sfn.StateMachine,
        alarm_topic: sns.ITopic,
        predict_machine: sfn.StateMachine | None = None,
        tune_machine: sfn.StateMachine | None = None,
    ) -> None:
        super().__init__(scope, construct_id)

        def job(name: str, label: str | None = None, statistic: str = "Average") -> cw.Metric:
            return cw.Metric(
                namespace=METRICS_NAMESPACE,
                metric_name=name,
                label=label or name,
                dimensions_map={JOB_DIMENSION: JOB_PLACEHOLDER},
                statistic=statistic,
                period=PERIOD,
            )

        self.dashboard = cw.Dashboard(
            self,
            "Dashboard",
            default_interval=Duration.hours(3),
            variables=[
                cw.DashboardVariable(
                    id="job",
                    label="Job",
                    type=cw.VariableType.PROPERTY,
                    value=JOB_DIMENSION,
                    input_type=cw.VariableInputType.SELECT,
                    values=cw.Values.from_search_components(
                        namespace=METRICS_NAMESPACE,
                        dimensions=[JOB_DIMENSION],
                        metric_name="Loss",
                        populate_from=JOB_DIMENSION,
                    ),
                    default_value=cw.DefaultValue.FIRST,
                )
            ],
        )
        graph = {"width": 8, "height": 6}
        self.dashboard.add_widgets(
            cw.TextWidget(
                markdown="## Job\nPick the job with the **Job** selector above (its `JobId`). "
                "Metrics arrive every few steps from the supervisor.",
                width=24,
                height=2,
            )
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(
                title="Loss and test metric",
                left=[job("Loss", "training loss")],
                right=[job("TestMetric", "test metric")],
                **graph,
            ),
            cw.GraphWidget(title="Active workers", left=[job("ActiveWorkers", statistic="Maximum")], **graph),
            cw.GraphWidget(title="Estimated cost so far (USD)", left=[job("CostUsd", statistic="Maximum")], **graph),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(
                title="Step time breakdown (s, mean over workers)",
                stacked=True,
                left=[
                    job("ComputeSeconds", "compute"),
                    job("CommSeconds", "communication"),
                    job("WaitSeconds", "barrier wait"),
                ],
                **graph,
            ),
            cw.GraphWidget(title="Step wall time (s)", left=[job("StepSeconds", "step")], **graph),
            cw.GraphWidget(
                title="Bytes exchanged and sent fraction",
                left=[job("BytesExchanged", "bytes per step", statistic="Sum")],
                right=[job("SentFraction", "share ISP sent")],
                **graph,
            ),
        )

        self.dashboard.add_widgets(cw.TextWidget(markdown="## Deployment", width=24, height=1))
        named = sorted(functions.items())
        self.dashboard.add_widgets(
            cw.GraphWidget(
                title="Lambda errors",
                statistic="Sum",
                left=[f.metric_errors(label=n, period=PERIOD) for n, f in named],
                **graph,
            ),
            cw.GraphWidget(
                title="Lambda throttles",
                statistic="Sum",
                left=[f.metric_throttles(label=n, period=PERIOD) for n, f in named],
                **graph,
            ),
            cw.GraphWidget(
                title="Lambda duration p90 (ms)",
                left=[f.metric_duration(label=n, period=PERIOD, statistic="p90") for n, f in named],
                **graph,
            ),
        )
        self.dashboard.add_widgets(*_cache_widgets(cache, graph))

        oldest_worker = cw.MathExpression(
            expression=f"MAX([{', '.join(f'w{i}' for i in range(len(worker_queues)))}])",
            using_metrics={
                f"w{i}": q.metric_approximate_age_of_oldest_message(period=PERIOD, statistic="Maximum")
                for i, q in enumerate(worker_queues)
            },
            label="worker queues (oldest)",
            period=PERIOD,
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(
                title="SQS age of oldest message (s)",
                left=[
                    supervisor_queue.metric_approximate_age_of_oldest_message(
                        label="supervisor queue", period=PERIOD, statistic="Maximum"
                    ),
                    oldest_worker,
                    dead_letters.metric_approximate_age_of_oldest_message(
                        label="dead letters", period=PERIOD, statistic="Maximum"
                    ),
                ],
                **graph,
            ),
            cw.GraphWidget(
                title="Executions",
                statistic="Sum",
                left=[
                    state_machine.metric_started(label="started", period=PERIOD),
                    state_machine.metric_succeeded(label="succeeded", period=PERIOD),
                    state_machine.metric_failed(label="failed", period=PERIOD),
                    state_machine.metric_timed_out(label="timed out", period=PERIOD),
                    state_machine.metric_aborted(label="aborted", period=PERIOD),
                ],
                **graph,
            ),
            cw.GraphWidget(
                title="Dead letters (messages)",
                statistic="Maximum",
                left=[dead_letters.metric_approximate_number_of_messages_visible(label="visible", period=PERIOD)],
                **graph,
            ),
        )

        if predict_machine is not None:
            self.dashboard.add_widgets(*_predict_widgets(predict_machine, graph))
        if tune_machine is not None:
            self.dashboard.add_widgets(*_tune_widgets(tune_machine, graph))

        alarm_action = cw_actions.SnsAction(alarm_topic)
        self.failed_executions_alarm = cw.Alarm(
            self,
            "FailedExecutions",
            alarm_description="An Ebb training execution failed (its report.json says why).",
            metric=state_machine.metric_failed(period=Duration.minutes(5), statistic="Sum"),
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )
        self.dead_letters_alarm = cw.Alarm(
            self,
            "DeadLetters",
            alarm_description="Signal messages reached the Ebb dead-letter queue.",
            metric=dead_letters.metric_approximate_number_of_messages_visible(
                period=Duration.minutes(5), statistic="Maximum"
            ),
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )
        for alarm in (self.failed_executions_alarm, self.dead_letters_alarm):
            alarm.add_alarm_action(alarm_action)

        self.dashboard_name = self.dashboard.dashboard_name
        self.url = Fn.join(
            "",
            [
                "https://",
                Aws.REGION,
                ".console.aws.amazon.com/cloudwatch/home?region=",
                Aws.REGION,
                "#dashboards:name=",
                self.dashboard.dashboard_name,
            ],
        )


def _summed(dimension: str, name: str, label: str, seconds: int) -> cw.MathExpression:
    """Metric ``name`` summed over every value of ``dimension`` (a SEARCH: one series per
    run or search, however many there are)."""
    return cw.MathExpression(
        expression=f"SUM(SEARCH('{{{METRICS_NAMESPACE},{dimension}}} MetricName=\"{name}\"', 'Sum', {seconds}))",
        label=label,
        period=PERIOD,
    )


def _runs_graph(title: str, machine: sfn.StateMachine, graph: dict) -> cw.GraphWidget:
    """A state machine's executions started, succeeded and failed."""
    return cw.GraphWidget(
        title=title,
        statistic="Sum",
        left=[
            machine.metric_started(label="started", period=PERIOD),
            machine.metric_succeeded(label="succeeded", period=PERIOD),
            machine.metric_failed(label="failed", period=PERIOD),
        ],
        **graph,
    )


def _predict_widgets(machine: sfn.StateMachine, graph: dict) -> list[cw.IWidget]:
    """`ebb predict --stack`: rows scored and skipped (bad rows) per minute over every run
    (SEARCH over the PredictRun dimension), and the Predict executions."""
    return [
        cw.TextWidget(markdown="## Predicting", width=24, height=1),
        cw.GraphWidget(
            title="Rows scored (per minute)",
            left=[_summed(PREDICT_DIMENSION, "RowsScored", "rows scored", 60)],
            **graph,
        ),
        cw.GraphWidget(
            title="Predict errors",
            left=[
                _summed(PREDICT_DIMENSION, "RowsSkipped", "bad rows skipped", 60),
                machine.metric_failed(label="failed runs", period=PERIOD, statistic="Sum"),
            ],
            **graph,
        ),
        _runs_graph("Predict runs", machine, graph),
    ]


def _tune_widgets(machine: sfn.StateMachine, graph: dict) -> list[cw.IWidget]:
    """`ebb tune --stack`: trials started and finished over every search, each search's best
    validation (the metrics the tune function puts, SEARCH over the TuneId dimension), and
    the Tune executions."""
    return [
        cw.TextWidget(markdown="## Tuning", width=24, height=1),
        cw.GraphWidget(
            title="Trials",
            left=[
                _summed(TUNE_DIMENSION, "TrialsStarted", "started", 300),
                _summed(TUNE_DIMENSION, "TrialsFinished", "finished", 300),
            ],
            **graph,
        ),
        cw.GraphWidget(
            title="Best validation (per search)",
            left=[
                cw.MathExpression(
                    expression=f"SEARCH('{{{METRICS_NAMESPACE},{TUNE_DIMENSION}}} "
                    f"MetricName=\"BestValidation\"', 'Minimum', 300)",
                    label="",
                    period=PERIOD,
                )
            ],
            **graph,
        ),
        _runs_graph("Tune runs", machine, graph),
    ]


def _cache_widgets(cache: Cache, graph: dict) -> list[cw.IWidget]:
    if cache.serverless_name:

        def metric(name: str, label: str, statistic: str) -> cw.Metric:
            return cw.Metric(
                namespace="AWS/ElastiCache",
                metric_name=name,
                label=label,
                statistic=statistic,
                dimensions_map={"clusterId": cache.serverless_name},
                period=PERIOD,
            )

        return [
            cw.GraphWidget(
                title="Cache compute (ECPUs)", left=[metric("ElastiCacheProcessingUnits", "ECPUs", "Sum")], **graph
            ),
            cw.GraphWidget(
                title="Cache data stored (bytes)", left=[metric("BytesUsedForCache", "bytes", "Maximum")], **graph
            ),
            cw.GraphWidget(
                title="Cache network (bytes)",
                statistic="Sum",
                left=[metric("NetworkBytesIn", "in", "Sum"), metric("NetworkBytesOut", "out", "Sum")],
                **graph,
            ),
        ]

    def node_metrics(name: str, statistic: str, suffix: str = "") -> list[cw.Metric]:
        return [
            cw.Metric(
                namespace="AWS/ElastiCache",
                metric_name=name,
                statistic=statistic,
                period=PERIOD,
                label=f"node {i + 1}{suffix}",
                dimensions_map={"CacheClusterId": node},
            )
            for i, node in enumerate(cache.node_ids)
        ]

    return [
        cw.GraphWidget(title="Cache engine CPU (%)", left=node_metrics("EngineCPUUtilization", "Maximum"), **graph),
        cw.GraphWidget(
            title="Cache memory used (%)", left=node_metrics("DatabaseMemoryUsagePercentage", "Maximum"), **graph
        ),
        cw.GraphWidget(
            title="Cache network (bytes)",
            left=(node_metrics("NetworkBytesIn", "Sum", " in") + node_metrics("NetworkBytesOut", "Sum", " out")),
            **graph,
        ),
    ]
