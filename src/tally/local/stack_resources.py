"""The local stack's resources, made as template.yaml declares them on the local endpoints.

The counted table comes from template.yaml, from the user's own template (adopting an
existing table), or from the rules' key schema, and is checked against the rules before
anything starts; the audit table, the alert topic, the queues and the alert inbox
subscribed to the topic come from template.yaml.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from tally.local.functions import bundled_rules, parameter_defaults
from tally.local.stack_record import REGION, LocalStack, LocalStackError, local_client
from tally.local.template import (
    TemplateResourceError,
    create_table,
    create_table_from,
    create_table_kwargs,
    load_template,
    resource,
    rules_table_kwargs,
    template_path,
    time_to_live_attribute,
)
from tally.reconciler.repair.switches import Switches
from tally.rules import load_rules
from tally.rules.live_table import TableShape, schema_problems

# Resource names are "<prefix>-<suffix>": a second stack on a shared DYNAMODB_ENDPOINT
# (the demo's) takes another prefix and never writes to the first one's tables.
PREFIX = "tally-local"
TABLE = "table"
AUDIT_TABLE = "audit"
ALERT_TOPIC = "alerts"
ALERT_INBOX = "alert-inbox"
RECHECK_QUEUE = "rechecks"
RECHECK_DEAD_LETTER_QUEUE = "rechecks-dead-letter"
STREAM_FAILURE_QUEUE = "stream-failures"
REPAIR_SWITCHES = "repair-switches"

# Template properties that map one-to-one onto SNS/SQS attributes.
_TOPIC_ATTRIBUTES = frozenset({"DisplayName"})
_QUEUE_ATTRIBUTES = frozenset(
    {
        "DelaySeconds",
        "MaximumMessageSize",
        "MessageRetentionPeriod",
        "ReceiveMessageWaitTimeSeconds",
        "SqsManagedSseEnabled",
        "VisibilityTimeout",
    }
)
# Encryption with a customer key needs KMS, which local mode does not run.
_LOCALLY_IGNORED = frozenset({"KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds"})


@dataclass(frozen=True)
class CountedTable:
    """The counted table's definition, checked against the rules before anything starts."""

    kwargs: dict[str, Any]
    ttl_attribute: str | None
    source: str


def counted_table(
    rules_file: Path | None, template: Path | None, table_id: str = "Table"
) -> CountedTable:
    """The table from ``template``'s ``table_id``, else from the rules' key schema when a
    rules file is given, else template.yaml's example table."""
    rules = load_rules(rules_file or bundled_rules(load_template(template_path())))
    if template is not None or rules_file is None:
        path = template or template_path()
        try:
            body = load_template(path)
            kwargs = create_table_kwargs(body, table_id, TABLE)
            ttl = time_to_live_attribute(body, table_id)
        except (OSError, ValueError, yaml.YAMLError, TemplateResourceError) as exc:
            raise LocalStackError(f"table {table_id!r} of {path}: {exc}") from exc
        except (KeyError, TypeError) as exc:
            raise LocalStackError(
                f"table {table_id!r} of {path}: local mode cannot read its {exc} "
                "(a plain value is needed, not an intrinsic function)"
            ) from exc
        table = CountedTable(kwargs, ttl, f"{path}#{table_id}")
    else:
        table = CountedTable(rules_table_kwargs(rules, TABLE), rules.table.ttl_attribute, "rules")
    problems = schema_problems(rules, replace(TableShape.of(table.kwargs), name=table.source))
    if problems:
        raise LocalStackError(
            f"{table.source} cannot hold these rules:\n  " + "\n  ".join(problems)
        )
    return table


def create_resources(
    state_dir: Path,
    prefix: str,
    counted: CountedTable,
    *,
    dynamodb_endpoint: str,
    dynamodb_pid: int | None,
    dynamodb_port: int | None,
    moto_endpoint: str,
    moto_pid: int,
    moto_port: int,
    region: str = REGION,
) -> LocalStack:
    """Create the counted table, the template's audit table, topic and queues, the alert
    inbox subscribed to the topic, and the repair switches' parameter, in ``region``."""
    template = load_template(template_path())

    def name(suffix: str) -> str:
        return f"{prefix}-{suffix}"

    dynamodb = local_client("dynamodb", dynamodb_endpoint, region=region)
    table = _existing(dynamodb, name(TABLE))
    if table is None:
        kwargs = counted.kwargs | {"TableName": name(TABLE)}
        table = create_table_from(dynamodb, kwargs, counted.ttl_attribute)
    elif TableShape.of(table).keys != TableShape.of(counted.kwargs).keys:
        raise LocalStackError(
            f"{dynamodb_endpoint} keeps a table {name(TABLE)} with other keys than "
            f"{counted.source}; delete it first"
        )
    if _existing(dynamodb, name(AUDIT_TABLE)) is None:
        create_table(dynamodb, template, "AuditTable", name(AUDIT_TABLE))

    sns = local_client("sns", moto_endpoint, region=region)
    sqs = local_client("sqs", moto_endpoint, region=region)
    topic_properties = resource(template, "AlertTopic", "AWS::SNS::Topic").get("Properties", {})
    topic_arn: str = sns.create_topic(
        Name=name(ALERT_TOPIC),
        Attributes=_attributes("AlertTopic", topic_properties, _TOPIC_ATTRIBUTES),
    )["TopicArn"]
    arns: dict[str, str] = {}
    dead_letter_url = _queue(
        sqs, template, "RecheckDeadLetterQueue", name(RECHECK_DEAD_LETTER_QUEUE), arns
    )
    recheck_url = _queue(sqs, template, "RecheckQueue", name(RECHECK_QUEUE), arns)
    failure_url = _queue(sqs, template, "StreamFailureQueue", name(STREAM_FAILURE_QUEUE), arns)
    inbox_url: str = sqs.create_queue(QueueName=name(ALERT_INBOX))["QueueUrl"]
    subscription_arn: str = sns.subscribe(
        TopicArn=topic_arn,
        Protocol="sqs",
        Endpoint=_queue_arn(sqs, inbox_url),
        ReturnSubscriptionArn=True,
    )["SubscriptionArn"]
    switches = repair_switches(local_client("ssm", moto_endpoint, region=region), template, prefix)
    return LocalStack(
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        table_name=name(TABLE),
        table_stream_arn=table["LatestStreamArn"],
        audit_table_name=name(AUDIT_TABLE),
        alert_topic_arn=topic_arn,
        alert_inbox_url=inbox_url,
        alert_subscription_arn=subscription_arn,
        recheck_queue_url=recheck_url,
        recheck_dead_letter_queue_url=dead_letter_url,
        stream_failure_queue_url=failure_url,
        dynamodb_endpoint=dynamodb_endpoint,
        dynamodb_pid=dynamodb_pid,
        dynamodb_port=dynamodb_port,
        moto_endpoint=moto_endpoint,
        moto_pid=moto_pid,
        moto_port=moto_port,
        state_dir=state_dir,
        table_source=counted.source,
        repair_switches_parameter=switches,
        region=region,
    )


def repair_switches(ssm: Any, template: dict[str, Any], prefix: str) -> str:
    """The repair switches' parameter, named as the template names it (the stack's name is the
    prefix) and holding what the template's parameters' defaults make it; its name."""
    defaults = parameter_defaults(template)
    first = Switches(
        enabled=defaults.get("RepairsEnabled", "true") == "true",
        dry_run=defaults.get("DryRun", "false") == "true",
        budget=int(defaults.get("RepairBudget", "25")),
        source="template",
    )
    name = f"/tally/{prefix}/{REPAIR_SWITCHES}"
    ssm.put_parameter(Name=name, Value=first.value(), Type="String", Overwrite=True)
    return name


def _existing(client: Any, name: str) -> dict[str, Any] | None:
    """A table a DYNAMODB_ENDPOINT of the user's kept across `down`, if there is one."""
    try:
        table: dict[str, Any] = client.describe_table(TableName=name)["Table"]
    except client.exceptions.ResourceNotFoundException:
        return None
    return table


def _queue(
    sqs: Any, template: dict[str, Any], logical_id: str, name: str, arns: dict[str, str]
) -> str:
    """Create the template's queue as ``name`` and return its URL; ``arns`` gains its ARN.

    A redrive policy's dead-letter queue must be created first, so its ARN is in ``arns``.
    """
    properties = dict(resource(template, logical_id, "AWS::SQS::Queue").get("Properties", {}))
    redrive = properties.pop("RedrivePolicy", None)
    attributes = _attributes(logical_id, properties, _QUEUE_ATTRIBUTES)
    if redrive is not None:
        target, _ = redrive["deadLetterTargetArn"]["Fn::GetAtt"]
        attributes["RedrivePolicy"] = json.dumps(
            {
                "deadLetterTargetArn": arns[target],
                "maxReceiveCount": int(redrive["maxReceiveCount"]),
            }
        )
    url: str = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    arns[logical_id] = _queue_arn(sqs, url)
    return url


def _queue_arn(sqs: Any, url: str) -> str:
    arn: str = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    return arn


def _attributes(
    logical_id: str, properties: Mapping[str, Any], supported: frozenset[str]
) -> dict[str, str]:
    """The properties as SNS/SQS attributes; an error for any local mode cannot honour."""
    unsupported = set(properties) - supported - _LOCALLY_IGNORED
    if unsupported:
        raise LocalStackError(
            f"local mode cannot create {logical_id} with {', '.join(sorted(unsupported))}; "
            "teach tally.local.stack_resources that property"
        )
    return {
        key: str(value).lower() if isinstance(value, bool) else str(value)
        for key, value in properties.items()
        if key in supported
    }
