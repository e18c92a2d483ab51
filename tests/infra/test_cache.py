"""Cache: TLS, encryption at rest, a generated AUTH token by dynamic reference, private subnets;
the replication group's shape from context; the serverless cache with its RBAC default user."""

from __future__ import annotations

import re

from tests.helpers.infra import resolve

DYNAMIC_SECRET = re.compile(r"^\{\{resolve:secretsmanager:<Ref:(\w+)>:SecretString:::\}\}$")


def secret_id(value) -> str:
    match = DYNAMIC_SECRET.match(resolve(value))
    assert match, f"not a Secrets Manager dynamic reference: {value}"
    return match.group(1)


def test_default_replication_group(default):
    _, group = default.one("AWS::ElastiCache::ReplicationGroup")
    assert group["Engine"] == "redis" and group["EngineVersion"] == "7.1"
    assert group["CacheNodeType"] == "cache.t4g.medium" and group["NumCacheClusters"] == 1
    assert group["TransitEncryptionEnabled"] is True and group["AtRestEncryptionEnabled"] is True
    assert group["AutomaticFailoverEnabled"] is False and group["MultiAZEnabled"] is False
    assert group["SnapshotRetentionLimit"] == 0 and group["Port"] == 6379
    token_secret = secret_id(group["AuthToken"])
    secret = default.of_type("AWS::SecretsManager::Secret")[token_secret]
    assert secret["GenerateSecretString"] == {"ExcludePunctuation": True, "PasswordLength": 64}
    assert "SecretString" not in secret
    _, subnets = default.one("AWS::ElastiCache::SubnetGroup")
    private = {k for k, v in default.of_type("AWS::EC2::Subnet").items() if not v.get("MapPublicIpOnLaunch")}
    assert {s["Ref"] for s in subnets["SubnetIds"]} == private
    assert not default.of_type("AWS::ElastiCache::ServerlessCache")


def test_functions_get_the_primary_endpoint_and_the_secret(default):
    group_id, _ = default.one("AWS::ElastiCache::ReplicationGroup")
    (secret,) = default.of_type("AWS::SecretsManager::Secret")
    for name in ("worker", "supervisor"):
        env = default.functions[name]["Environment"]["Variables"]
        assert (
            resolve(env["EBB_REDIS_URLS"])
            == f"rediss://<{group_id}.PrimaryEndPoint.Address>:<{group_id}.PrimaryEndPoint.Port>"
        )
        assert env["EBB_REDIS_CLUSTER"] == "0"
        assert env["EBB_REDIS_SECRET_ARN"] == {"Ref": secret}


def test_sharded_replicated_group_is_cluster_mode_and_multi_az(scaled):
    group_id, group = scaled.one("AWS::ElastiCache::ReplicationGroup")
    assert group["NumNodeGroups"] == 2 and group["ReplicasPerNodeGroup"] == 1 and "NumCacheClusters" not in group
    assert group["CacheParameterGroupName"] == "default.redis7.cluster.on"
    assert group["AutomaticFailoverEnabled"] is True and group["MultiAZEnabled"] is True
    env = scaled.functions["worker"]["Environment"]["Variables"]
    assert env["EBB_REDIS_CLUSTER"] == "1"
    assert resolve(env["EBB_REDIS_URLS"]) == (
        f"rediss://<{group_id}.ConfigurationEndPoint.Address>:<{group_id}.ConfigurationEndPoint.Port>"
    )


def test_serverless_cache_authenticates_the_default_user_with_the_token(serverless):
    assert not serverless.of_type("AWS::ElastiCache::ReplicationGroup")
    cache_id, cache = serverless.one("AWS::ElastiCache::ServerlessCache")
    assert cache["Engine"] == "valkey" and cache["MajorEngineVersion"] == "8"
    assert cache["ServerlessCacheName"] == "ebb-cache"
    assert cache["CacheUsageLimits"]["DataStorage"] == {"Maximum": 2, "Unit": "GB"}
    assert len(cache["SubnetIds"]) == 2
    group_id, group = serverless.one("AWS::ElastiCache::UserGroup")
    assert cache["UserGroupId"] == {"Ref": group_id}
    user_id, user = serverless.one("AWS::ElastiCache::User")
    assert group["UserIds"] == [{"Ref": user_id}]
    # Serverless takes no AUTH token; `AUTH <token>` authenticates the user named "default".
    assert user["UserName"] == "default" and user["AccessString"] == "on ~* +@all"
    assert user["AuthenticationMode"]["Type"] == "password"
    (password,) = user["AuthenticationMode"]["Passwords"]
    (secret,) = serverless.of_type("AWS::SecretsManager::Secret")
    assert secret_id(password) == secret
    env = serverless.functions["supervisor"]["Environment"]["Variables"]
    assert env["EBB_REDIS_CLUSTER"] == "1"
    assert resolve(env["EBB_REDIS_URLS"]) == f"rediss://<{cache_id}.Endpoint.Address>:<{cache_id}.Endpoint.Port>"
    # The serverless reader endpoint listens on 6380: both ports, from the functions only.
    rules = [
        r
        for r in serverless.of_type("AWS::EC2::SecurityGroupIngress").values()
        if r["GroupId"] == {"Fn::GetAtt": [cache["SecurityGroupIds"][0]["Fn::GetAtt"][0], "GroupId"]}
    ]
    assert [(r["FromPort"], r["ToPort"]) for r in rules] == [(6379, 6380)]
