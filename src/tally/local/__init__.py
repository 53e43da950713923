"""Local mode: DynamoDB Local and tables built from template.yaml."""
