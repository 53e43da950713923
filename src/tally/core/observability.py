"""The one Logger, Metrics and Tracer every handler shares."""

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger()
metrics = Metrics()
tracer = Tracer()
