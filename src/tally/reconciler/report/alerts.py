"""Alerts: one SNS message per finding, delivered at least once through the outbox.

A finding's alert is written to the audit table's outbox in the same transaction as its
repair (or its standing slot), then published and marked sent. A publish that fails
leaves it pending: the next flush (a retried batch, a recheck, the audit) sends it.
"""

from __future__ import annotations

import json
from typing import Any

from tally.reconciler.findings import AlertMessage
from tally.reconciler.store.outbox import AlertOutbox


class AlertPublisher:
    """Publishes outbox alerts to the alert topic and marks them sent."""

    def __init__(self, sns_client: Any, topic_arn: str, store: AlertOutbox):
        self.sns = sns_client
        self.topic_arn = topic_arn
        self.store = store

    def send(self, message: AlertMessage) -> None:
        """Publish an alert this process just wrote to the outbox (it holds the lease)."""
        try:
            self._publish(message)
        except Exception:
            self.store.release_alert(message.alert_id)
            raise
        self.store.alert_sent(message.alert_id)

    def flush(self) -> tuple[int, list[str]]:
        """Publish every pending alert whose lease ran out: how many were sent, and why the
        others were not. One alert that cannot be sent never holds back the rest."""
        sent, errors = 0, []
        for item in self.store.pending_alerts():
            alert_id = str(item["SK"])
            try:
                if not self.store.lease_alert(alert_id):
                    continue  # another publisher took it
                message = AlertMessage(
                    alert_id,
                    str(item["subject"]),
                    str(item["message"]),
                    json.loads(item["attributes"]),
                )
                self.send(message)
                sent += 1
            except Exception as error:
                errors.append(f"alert {alert_id}: {type(error).__name__}: {error}")
        return sent, errors

    def _publish(self, message: AlertMessage) -> None:
        self.sns.publish(
            TopicArn=self.topic_arn,
            Subject=message.subject,
            Message=message.body,
            MessageAttributes=message.attributes,
        )
