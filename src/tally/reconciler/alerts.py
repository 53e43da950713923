"""Alerts: one SNS message per finding, de-duplicated through the audit table."""

from __future__ import annotations

import json
from typing import Any

from tally.reconciler.audit_store import AuditStore
from tally.reconciler.findings import Finding


class AlertPublisher:
    """Publishes findings to the alert topic, at most once per finding id."""

    def __init__(self, sns_client: Any, topic_arn: str, store: AuditStore):
        self.sns = sns_client
        self.topic_arn = topic_arn
        self.store = store

    def publish(self, finding: Finding) -> bool:
        """Publish the finding; False when it was already alerted (a redelivered batch)."""
        if not self.store.claim_alert(finding.finding_id):
            return False
        try:
            self.sns.publish(
                TopicArn=self.topic_arn,
                Subject=finding.subject(),
                Message=json.dumps(finding.body()),
                MessageAttributes=finding.message_attributes(),
            )
        except Exception:
            # A claim kept after a failed publish would silence the retry: the alert would be lost.
            self.store.release_alert(finding.finding_id)
            raise
        return True
