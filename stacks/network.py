"""Network: a VPC for the cache and the functions that talk to it.

Only the worker and supervisor speak to Redis, so only they run in the VPC; the other
functions stay outside it and reach S3 and SNS over AWS's public endpoints. The in-VPC
functions call S3 (through a free gateway endpoint) and, by default, Secrets Manager,
SQS and SNS through interface endpoints, placed in `endpoint_azs` availability zones.
The alternative egress, "nat", is one NAT gateway. Lambda delivers the functions' logs
(and so the embedded-format metrics) itself, outside the VPC. README "Deploy on AWS" has
the idle cost of each choice.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

_SERVICES = {
    "secretsmanager": ec2.InterfaceVpcEndpointAwsService.SECRETS_MANAGER,
    "sqs": ec2.InterfaceVpcEndpointAwsService.SQS,
    "sns": ec2.InterfaceVpcEndpointAwsService.SNS,
    "xray": ec2.InterfaceVpcEndpointAwsService.XRAY,
    "logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "monitoring": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_MONITORING,
    "lambda": ec2.InterfaceVpcEndpointAwsService.LAMBDA_,
    "states": ec2.InterfaceVpcEndpointAwsService.STEP_FUNCTIONS,
}


class Network(Construct):
    """The VPC, its private subnets, the AWS API route (endpoints or NAT) and the functions' security group."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        max_azs: int,
        egress: str,
        interface_endpoints: Sequence[str],
        endpoint_azs: int,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        nat = egress == "nat"
        private_type = ec2.SubnetType.PRIVATE_WITH_EGRESS if nat else ec2.SubnetType.PRIVATE_ISOLATED
        subnets = [ec2.SubnetConfiguration(name="Private", subnet_type=private_type, cidr_mask=20)]
        if nat:
            subnets.insert(0, ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24))
        flow_logs = logs.LogGroup(
            self,
            "FlowLogs",
            log_group_name=f"/ebb/{Stack.of(self).stack_name}/vpc-flow-logs",
            retention=log_retention,
            removal_policy=removal_policy,
        )
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr("10.40.0.0/16"),
            max_azs=max_azs,
            subnet_configuration=subnets,
            # One NAT gateway, not one per AZ: a batch job resumes from its checkpoints.
            nat_gateways=1 if nat else 0,
            gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
            flow_logs={
                "All": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
                    traffic_type=ec2.FlowLogTrafficType.ALL,
                )
            },
        )
        self.private_subnets = ec2.SubnetSelection(subnet_type=private_type)
        self.private_subnet_ids = self.vpc.select_subnets(subnet_type=private_type).subnet_ids

        self.functions_security_group = ec2.SecurityGroup(
            self, "Functions", vpc=self.vpc, allow_all_outbound=False, description="Ebb worker and supervisor functions"
        )
        # HTTPS leaves only for S3 (gateway endpoint route) and the AWS APIs (endpoints or NAT);
        # the cache grants its own port (see Cache).
        self.functions_security_group.add_egress_rule(
            ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to S3 and the AWS APIs"
        )

        self.interface_endpoints: dict[str, ec2.InterfaceVpcEndpoint] = {}
        if not nat:
            endpoint_subnets = self.vpc.isolated_subnets[:endpoint_azs]
            for name in interface_endpoints:
                endpoint = self.vpc.add_interface_endpoint(
                    f"{name.capitalize()}Endpoint",
                    service=_SERVICES[name],
                    subnets=ec2.SubnetSelection(subnets=endpoint_subnets),
                    private_dns_enabled=True,
                    open=False,  # not the whole VPC CIDR: only the functions' security group
                )
                endpoint.connections.allow_default_port_from(self.functions_security_group, f"Ebb functions to {name}")
                self.interface_endpoints[name] = endpoint
