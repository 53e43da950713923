"""Alerts: one SNS message per finding, de-duplicated through the audit table."""

from __future__ import annotations

import json
from typing import Any

from tally.reconciler.audit_store import AuditStore
from tally.reconciler.findings import Finding


class AlertPublisher:
    """Publishes findings to the alert topic, once per finding and repair outcome.

    A redelivered batch finds the same broken state with the same outcome and stays
    silent; a later, different outcome (a dry run, then the applied repair) is news.
    """

    def __init__(self, sns_client: Any, topic_arn: str, store: AuditStore):
        self.sns = sns_client
        self.topic_arn = topic_arn
        self.store = store

    def publish(self, finding: Finding) -> bool:
        """Publish the finding; False when it was already alerted (a redelivered batch)."""
        repair = finding.repair.status if finding.repair else "skipped"
        claim = f"{finding.finding_id}:{repair}"
        if not self.store.claim_alert(claim):
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
            self.store.release_alert(claim)
            raise
        return True
