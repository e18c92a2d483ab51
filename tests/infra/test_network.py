"""Network: private subnets, the AWS API route (interface endpoints or one NAT), and security
groups through which only the functions reach the cache and the endpoints."""

from __future__ import annotations

from tests.helpers.infra import resolve


def functions_group(synth) -> str:
    return next(
        k
        for k, v in synth.of_type("AWS::EC2::SecurityGroup").items()
        if v["GroupDescription"] == "Ebb worker and supervisor functions"
    )


def ingress_rules(synth) -> list[dict]:
    """Every ingress rule: inline in a security group or a separate resource, with its group."""
    rules = [
        {**r, "GroupId": {"Fn::GetAtt": [k, "GroupId"]}}
        for k, v in synth.of_type("AWS::EC2::SecurityGroup").items()
        for r in v.get("SecurityGroupIngress", [])
    ]
    return rules + list(synth.of_type("AWS::EC2::SecurityGroupIngress").values())


def test_default_vpc_is_private_with_endpoints_in_one_az(default):
    assert not default.of_type("AWS::EC2::InternetGateway") and not default.of_type("AWS::EC2::NatGateway")
    subnets = default.of_type("AWS::EC2::Subnet")
    assert len(subnets) == 2 and not any(s.get("MapPublicIpOnLaunch") for s in subnets.values())
    endpoints = default.of_type("AWS::EC2::VPCEndpoint").values()
    gateway = [e for e in endpoints if e.get("VpcEndpointType", "Gateway") == "Gateway"]
    assert [resolve(e["ServiceName"]) for e in gateway] == ["com.amazonaws.<Ref:AWS::Region>.s3"]
    interfaces = {
        resolve(e["ServiceName"]).rsplit(".", 1)[1]: e for e in endpoints if e.get("VpcEndpointType") == "Interface"
    }
    assert set(interfaces) == {"secretsmanager", "sqs", "sns"}
    for endpoint in interfaces.values():
        assert endpoint["PrivateDnsEnabled"] is True
        assert len(endpoint["SubnetIds"]) == 1  # ebb:endpointAzs = 1: each endpoint is billed per AZ


def test_only_the_functions_security_group_is_admitted_anywhere(default, serverless):
    for synth in (default, serverless):
        functions = functions_group(synth)
        rules = ingress_rules(synth)
        assert rules
        for rule in rules:
            assert "CidrIp" not in rule and "CidrIpv6" not in rule, rule
            assert rule["SourceSecurityGroupId"] == {"Fn::GetAtt": [functions, "GroupId"]}, rule
    cache_group = next(
        k
        for k, v in default.of_type("AWS::EC2::SecurityGroup").items()
        if v["GroupDescription"].startswith("Ebb cache")
    )
    to_cache = [r for r in ingress_rules(default) if r["GroupId"] == {"Fn::GetAtt": [cache_group, "GroupId"]}]
    assert [(r["IpProtocol"], r["FromPort"], r["ToPort"]) for r in to_cache] == [("tcp", 6379, 6379)]
    others = [r for r in ingress_rules(default) if r not in to_cache]
    assert {(r["FromPort"], r["ToPort"]) for r in others} == {(443, 443)}  # the interface endpoints


def test_functions_may_leave_only_for_https_and_the_cache_port(default):
    functions = default.of_type("AWS::EC2::SecurityGroup")[functions_group(default)]
    inline = functions["SecurityGroupEgress"]
    assert [(r["CidrIp"], r["FromPort"], r["ToPort"]) for r in inline] == [("0.0.0.0/0", 443, 443)]
    separate = [
        r
        for r in default.of_type("AWS::EC2::SecurityGroupEgress").values()
        if r["GroupId"] == {"Fn::GetAtt": [functions_group(default), "GroupId"]}
    ]
    assert {(r["FromPort"], r["ToPort"]) for r in separate} == {(6379, 6379), (443, 443)}
    assert all("DestinationSecurityGroupId" in r for r in separate)


def test_only_worker_and_supervisor_run_in_the_vpc(default):
    in_vpc = {name for name, props in default.functions.items() if "VpcConfig" in props}
    assert in_vpc == {"worker", "supervisor"}
    group = functions_group(default)
    for name in in_vpc:
        config = default.functions[name]["VpcConfig"]
        assert config["SecurityGroupIds"] == [{"Fn::GetAtt": [group, "GroupId"]}]
        assert len(config["SubnetIds"]) == 2


def test_nat_egress_replaces_the_interface_endpoints(scaled):
    assert len(scaled.of_type("AWS::EC2::NatGateway")) == 1
    assert len(scaled.of_type("AWS::EC2::InternetGateway")) == 1
    endpoints = scaled.of_type("AWS::EC2::VPCEndpoint").values()
    assert [e.get("VpcEndpointType", "Gateway") for e in endpoints] == ["Gateway"]  # S3 stays free of NAT charges
    public = {k for k, v in scaled.of_type("AWS::EC2::Subnet").items() if v.get("MapPublicIpOnLaunch")}
    worker_subnets = {s["Ref"] for s in scaled.functions["worker"]["VpcConfig"]["SubnetIds"]}
    assert len(public) == 2 and worker_subnets and not worker_subnets & public


def test_vpc_flow_logs_go_to_a_log_group_with_retention(default):
    ((_, flow_log),) = default.of_type("AWS::EC2::FlowLog").items()
    assert flow_log["TrafficType"] == "ALL" and flow_log["LogDestinationType"] == "cloud-watch-logs"
    group = flow_log["LogGroupName"]["Ref"]
    assert default.of_type("AWS::Logs::LogGroup")[group]["RetentionInDays"] == 30
