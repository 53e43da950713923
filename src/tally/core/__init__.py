"""The ground floor: AWS clients, DynamoDB's types and numbers, settings, logs, stream reading."""
